"""The planner: an OR-Tools integer program over parallelization strategies (see ``ilp.py``)."""
from .ilp import Problem, Solution
from .search import Request, solve
from .space import FIXED_KEYS, RUNTIME, Candidate

__all__ = ["FIXED_KEYS", "RUNTIME", "Candidate", "Problem", "Request", "Solution", "solve"]
