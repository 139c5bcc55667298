"""Build a model without its weights, shard it, then give each rank only the weights it holds.

``build_on_meta(source, seed)`` constructs the model with every parameter on the meta device (no
memory) and its buffers real (rotary tables and the like are computed by the constructor, cheap, and
cannot be recomputed from a meta tensor): ``register_parameter`` moves each parameter to meta as it
is registered, as ``accelerate.init_empty_weights(include_buffers=False)`` does. The Program's steps
then shard the meta model (tensor parallelism, FSDP2 ``fully_shard``, the pipeline split and the
expert split all work on meta tensors), and ``materialize`` allocates this rank's shards
(``to_empty``) and fills them.

The values are those of ``torch.manual_seed(seed); build(source)`` in one process, whatever the plan:
``materialize`` replays the model's own initialization on CPU one module at a time, in the order
the constructor ran it, drawing from the global generator seeded with ``seed``, and copies into each
parameter only this rank's part of the full tensor (``distribute_tensor(..., src_data_rank=None)``:
the local chunk, no communication). Every rank draws the whole stream (the same numbers in the same
order) but never holds more than one module's full parameters at a time. The replay:

1. construction: each module's ``reset_parameters`` (PyTorch's own layers), in registration order;
2. the model's init pass: ``meshplan.zoo``'s ``init_weights`` (one parameter at a time, in
   ``named_parameters`` order). A Hugging Face model's build is recorded instead (``_BuildRecorder``): each
   random fill its constructors make and each ``post_init``, in the order they ran; the replay draws the
   same fills and applies ``_init_weights`` per module where each ``post_init`` ran (children first, as
   ``PreTrainedModel.initialize_weights`` applies it). Other models (a user's builder) get step 1
   only, which is their construction when they use PyTorch's layers' own init: ``REPLAYABLE`` lists the
   source kinds whose whole initialization is replayed; for the others callers build the model whole.

A parameter a constructor registers with a value of its own (Apertus's xIELU activation registers its two
learned slopes as ``log(expm1(0.8))``, not as an empty tensor an init then fills) keeps that value where no
init rewrites it: ``parameters_on_meta`` keeps a copy of each small parameter as registered
(``CONSTRUCTED_MAX_ELEMS``: scales, slopes, norms' weights, biases), and the replay starts each twin from it
instead of an empty tensor.

Weights a model ties (a head that is the embedding's table) stay one parameter: ``to_empty`` gives each
holder a tensor of its own, and ``materialize`` points them back at one (``tied_parameters``).
"""
from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass, field
from typing import Any, Generator, Iterator

import torch
from torch import nn
from torch.distributed.tensor import DTensor, distribute_tensor
from torch.utils._python_dispatch import TorchDispatchMode

from ..ir import InvalidPlanError

REPLAYABLE = ("zoo", "hf")  # source kinds whose whole initialization materialize replays exactly
# the largest parameter whose value as registered the meta build keeps (a computed scale or a norm's weight; a
# weight matrix is registered empty and filled by an init, which the replay draws again)
CONSTRUCTED_MAX_ELEMS = 1 << 16
INIT_ATTR = "_meshplan_meta_init"  # the MetaInit a meta-built model carries


@dataclass(frozen=True, slots=True)
class MetaInit:
    """How to fill a meta-built model: the seed its one-process twin was built under, and a meta copy
    of the model as built (clean names, unwrapped modules, real buffers) to replay the init on."""

    seed: int
    reference: nn.Module
    # a Hugging Face build's random fills and init calls, in order (``_BuildRecorder``); None: not recorded
    events: tuple[tuple, ...] | None = None
    # small parameters' values as their constructors registered them, by name (``parameters_on_meta``)
    constructed: dict[str, torch.Tensor] = field(default_factory=dict)


@contextlib.contextmanager
def parameters_on_meta(values: dict[int, torch.Tensor] | None = None) -> Iterator[None]:
    """Construct modules with their parameters on meta and their buffers real; ``values`` (by the meta
    parameter's id) receives a copy of each parameter of at most ``CONSTRUCTED_MAX_ELEMS`` as registered."""
    original = nn.Module.register_parameter

    def register(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        if param is not None and not param.is_meta:
            real = param.detach()
            param = nn.Parameter(real.to("meta"), requires_grad=param.requires_grad)
            if values is not None and real.numel() <= CONSTRUCTED_MAX_ELEMS:
                values[id(param)] = real.clone()
        original(module, name, param)

    nn.Module.register_parameter = register  # type: ignore[method-assign]
    try:
        yield
    finally:
        nn.Module.register_parameter = original  # type: ignore[method-assign]


def build_on_meta(source: dict[str, Any], seed: int) -> nn.Module:
    """The model of ``source`` with meta parameters, carrying what ``materialize`` needs to give it the
    weights of ``torch.manual_seed(seed); runtime.source.build(source)``. Sources outside
    ``REPLAYABLE`` are built whole (after ``torch.manual_seed(seed)``)."""
    from .source import build

    kind = source.get("kind")
    if kind not in REPLAYABLE:
        torch.manual_seed(seed)
        return build(source)
    values: dict[int, torch.Tensor] = {}
    with parameters_on_meta(values), _BuildRecorder(enabled=kind == "hf") as recorder:
        model = build(source)
    constructed = {name: values[id(p)] for name, p in model.named_parameters() if id(p) in values}
    mark_meta(model, seed, recorder.events(model), constructed)
    return model


_RANDOM_FILLS = frozenset(("normal_", "uniform_", "bernoulli_", "exponential_", "random_", "geometric_",
                           "log_normal_", "cauchy_"))


class _BuildRecorder(TorchDispatchMode):
    """What a Hugging Face model's construction does to the random stream, in order: each random fill a
    constructor makes (on meta parameters, so nothing is drawn here) and each ``post_init``'s
    ``initialize_weights`` call (skipped here: on meta it would only fill meta tensors). ``replay`` draws
    the same fills on scratch tensors of the same shapes and runs each init where it ran, which is what
    one process does whatever the layers' constructors look like (GPT-2's ``Conv1D`` fills its weight in
    ``__init__`` and has no ``reset_parameters``)."""

    def __init__(self, enabled: bool) -> None:
        super().__init__()
        self.enabled = enabled
        self._events: list[tuple] = []
        self._patched: tuple | None = None

    def __enter__(self):
        if not self.enabled:
            return self
        from transformers import PreTrainedModel

        original = PreTrainedModel.initialize_weights
        self._patched = (PreTrainedModel, original)

        def initialize_weights(model: nn.Module) -> None:
            self._events.append(("init", model))

        PreTrainedModel.initialize_weights = initialize_weights  # type: ignore[method-assign]
        return super().__enter__()

    def __exit__(self, *exc: Any) -> None:
        if self._patched is None:
            return None
        cls, original = self._patched
        cls.initialize_weights = original  # type: ignore[method-assign]
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket.__name__ in _RANDOM_FILLS and isinstance(args[0], torch.Tensor):
            target = args[0]
            if not all(isinstance(a, (int, float, bool, type(None))) for a in args[1:]) or any(
                    v is not None for k, v in (kwargs or {}).items() if k == "generator"):
                raise InvalidPlanError(f"the model's constructor fills a weight with {func} from a tensor or its "
                                       "own generator, which meta initialization cannot replay; build it whole "
                                       "(meshplan.runtime.source.build) and pass the module")
            self._events.append(("draw", func, tuple(target.shape), target.dtype, tuple(args[1:]),
                                 {k: v for k, v in (kwargs or {}).items() if k != "generator"}))
        return func(*args, **(kwargs or {}))

    def events(self, model: nn.Module) -> tuple[tuple, ...] | None:
        """The recorded events, each init named by its module's path in ``model`` (None when not recording)."""
        if not self.enabled:
            return None
        paths = {id(m): name for name, m in model.named_modules()}
        return tuple(("init", paths[id(e[1])]) if e[0] == "init" else e for e in self._events)


def mark_meta(model: nn.Module, seed: int, events: tuple[tuple, ...] | None = None,
              constructed: dict[str, torch.Tensor] | None = None) -> nn.Module:
    """Record on a meta-built ``model`` the seed and a meta copy to replay its init on (before any step)."""
    setattr(model, INIT_ATTR, MetaInit(seed=seed, reference=copy.deepcopy(model), events=events,
                                       constructed=constructed or {}))
    return model


def is_meta(model: nn.Module) -> bool:
    return any(p.is_meta for p in model.parameters())


def meta_init_of(model: nn.Module) -> MetaInit:
    init = getattr(model, INIT_ATTR, None)
    if not isinstance(init, MetaInit):
        raise InvalidPlanError("the model has parameters on the meta device but no record of how to initialize "
                               "them; build it with meshplan.runtime.materialize.build_on_meta(source, seed), "
                               "or pass a model with real weights")
    return init


def materialized(model: nn.Module, mesh: Any) -> nn.Module:
    """``model`` with real weights: a meta-built one (``build_on_meta``) is materialized on the mesh's
    device (this process's GPU, or the CPU); a model with weights is returned as it is. What emitted
    scripts call after ``parallelize`` (and before ``DistributedDataParallel``, which needs weights)."""
    if not is_meta(model):
        return model
    kind = mesh.device_type
    device = torch.device(kind, torch.cuda.current_device()) if kind == "cuda" else torch.device(kind)
    materialize(model, device, meta_init_of(model))
    return model


def clean_name(name: str) -> str:
    """A parameter's name in the model as built: wrapper prefixes dropped."""
    return name.replace("_checkpoint_wrapped_module.", "").replace("_fsdp_wrapped_module.", "")


def materialize(model: nn.Module, device: torch.device, init: MetaInit) -> None:
    """Allocate this rank's parameters of the sharded ``model`` on ``device`` and fill them with the
    values of the one-process model; buffers are copied from the model as built."""
    from .expert import expert_shard_groups

    ties = tied_parameters(model)
    model.to_empty(device=device)  # FSDP2 re-points its sharded parameters here (FSDPModule._apply)
    for module, attr, owner, owner_attr in ties:  # to_empty gave each holder of a tied weight its own tensor
        setattr(module, attr, getattr(owner, owner_attr))
    groups = expert_shard_groups(model)  # parameters expert parallelism cut to this ep rank's experts
    live = {clean_name(n): p for n, p in model.named_parameters()}
    ep = {name: groups[id(p)] for name, p in live.items() if id(p) in groups}
    aliases = shared_names(init.reference)
    with torch.no_grad():
        for name, full in replay(init):
            if name not in aliases:  # another name of a tied weight: its value is the first name's
                continue
            for holder in aliases[name]:  # a pipeline's last stage holds a tied head's copy by its own name
                target = live.get(holder)
                if target is not None:
                    _copy_local(full, target, ep.get(holder))
        ref_buffers = dict(init.reference.named_buffers())
        for name, buf in model.named_buffers():
            src = ref_buffers.get(clean_name(name))
            if src is not None:
                buf.copy_(src)


def shared_names(module: nn.Module) -> dict[str, tuple[str, ...]]:
    """Each parameter's first name -> all its names, wrapper prefixes dropped (a tied weight has several:
    ``transformer.wte.weight`` and ``lm_head.weight``); the names after the first are not keys."""
    names: dict[int, list[str]] = {}
    for name, p in module.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(clean_name(name))
    return {group[0]: tuple(group) for group in names.values()}


def tied_parameters(model: nn.Module) -> list[tuple[nn.Module, str, nn.Module, str]]:
    """(module, name, owner, owner's name) for each parameter a module holds that an earlier module (in
    ``named_parameters`` order) holds too: a head tied to the embedding. ``to_empty``, moving a meta model to
    a device, gives every holder a tensor of its own, so the model would train two weights where the one
    process trains one; ``materialize`` points them back at the owner's."""
    owners: dict[int, tuple[nn.Module, str]] = {}
    ties = []
    for module in model.modules():
        for attr, p in module._parameters.items():
            if p is None:
                continue
            if id(p) in owners:
                ties.append((module, attr, *owners[id(p)]))
            else:
                owners[id(p)] = (module, attr)
    return ties


def _copy_local(full: torch.Tensor, target: torch.Tensor, ep_group: Any) -> None:
    """Copy this rank's part of ``full`` into ``target`` (a plain tensor or a DTensor)."""
    if ep_group is not None:  # expert parallelism kept this ep rank's slice of dim 0
        per = target.shape[0]
        rank = torch.distributed.get_rank(ep_group)
        full = full[rank * per:(rank + 1) * per]
    if isinstance(target, DTensor):
        part = distribute_tensor(full, target.device_mesh, target.placements, src_data_rank=None).to_local()
        target.to_local().copy_(part)
    else:
        target.copy_(full)


def _twin(module: nn.Module, constructed: dict[str, torch.Tensor], path: str) -> nn.Module:
    """A CPU copy of ``module`` (at ``path``) with its own parameters allocated (full size), each as its
    constructor registered it where that was kept (``MetaInit.constructed``), and no children."""
    def start(name: str, p: nn.Parameter) -> torch.Tensor:
        kept = constructed.get(f"{path}.{name}" if path else name)
        return torch.empty(p.shape, dtype=p.dtype) if kept is None else kept.clone()

    twin = copy.copy(module)
    twin._parameters = {name: None if p is None else nn.Parameter(start(name, p), requires_grad=p.requires_grad)
                        for name, p in module._parameters.items()}
    twin._buffers = dict(module._buffers)  # real already: an init that resets a buffer writes the reference's
    twin._modules = {}
    twin.__dict__.pop("_is_hf_initialized", None)  # Hugging Face's init skips modules it marked done (on meta)
    return twin


def replay(init: MetaInit) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, full tensor) for each parameter as the one-process construction leaves it, one module at a
    time (a name may come twice: the last value is the one that stays)."""
    ref = init.reference
    torch.manual_seed(init.seed)
    with torch.no_grad():
        if _is_hf(ref):
            yield from _hf_build(ref, init.events or (), init.constructed)
            return
        zoo = type(ref).__module__.startswith("meshplan.zoo") and callable(getattr(ref, "init_weights", None))
        for prefix, module in ref.named_modules():  # 1. construction: PyTorch layers' own reset_parameters
            twin = _constructed(module, init.constructed, prefix)
            if twin is not None and not zoo:
                yield from _named(prefix, twin)
        if zoo:
            yield from _zoo_init(ref)


def _is_hf(module: nn.Module) -> bool:
    return callable(getattr(module, "_initialize_weights", None)) and hasattr(getattr(module, "config", None),
                                                                              "to_dict")


def _constructed(module: nn.Module, constructed: dict[str, torch.Tensor], path: str) -> nn.Module | None:
    """A twin of ``module`` as its constructor leaves it (``reset_parameters``), or None if it has no
    parameters of its own or no such method."""
    if not any(p is not None for p in module._parameters.values()) or not callable(
            getattr(module, "reset_parameters", None)):
        return None
    twin = _twin(module, constructed, path)
    twin.reset_parameters()
    return twin


def _named(prefix: str, twin: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    for name, p in twin._parameters.items():
        if p is not None:
            yield (f"{prefix}.{name}" if prefix else name), p.detach()


def _zoo_init(ref: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """``Transformer.init_weights`` (a loop over ``named_parameters``), one parameter at a time: run on a
    skeleton that holds only that parameter, under its name, with the model's config."""
    for name, p in ref.named_parameters():
        skeleton = nn.Module()
        skeleton.config = ref.config
        parent, _, attr = name.rpartition(".")
        node = skeleton
        for part in parent.split(".") if parent else ():
            child = nn.Module()
            node.add_module(part, child)
            node = child
        full = nn.Parameter(torch.empty(p.shape, dtype=p.dtype))
        node.register_parameter(attr, full)
        type(ref).init_weights(skeleton)
        yield name, full.detach()


def _initialize(path: str, module: nn.Module, init: nn.Module, done: set[str], constructed: dict[str, torch.Tensor]
                ) -> Generator[tuple[str, torch.Tensor], None, nn.Module | None]:
    """``init._initialize_weights`` applied to ``module`` (at ``path`` in the model) and its children, children
    first, skipping the sub-models in ``done`` (``PreTrainedModel.initialize_weights``). Yields each parameter
    as the init leaves it, and a child's again where its parent's init rewrote it (GPT-2's scales its blocks'
    ``c_proj``); returns the module's twin, without children, for its parent's init, so at most one module
    and its children's own parameters are held at a time."""
    if path in done:
        return None
    children = {}
    for name, child in module.named_children():
        children[name] = yield from _initialize(f"{path}.{name}" if path else name, child, init, done, constructed)
    twin = _twin(module, constructed, path)
    twin._modules = {name: c for name, c in children.items() if c is not None}
    before = {(name, p_name): p._version for name, c in twin._modules.items()
              for p_name, p in c._parameters.items() if p is not None}
    init._initialize_weights(twin, init.is_custom_code())
    yield from _named(path, twin)
    for (name, p_name), version in before.items():
        p = twin._modules[name]._parameters[p_name]
        if p._version != version:
            yield (f"{path}.{name}" if path else name) + f".{p_name}", p.detach()
    twin._modules = {}
    return twin


def _hf_build(model: nn.Module, events: tuple[tuple, ...],
              constructed: dict[str, torch.Tensor]) -> Iterator[tuple[str, torch.Tensor]]:
    """A Hugging Face ``PreTrainedModel`` as its recorded build ran: each constructor's random fill drawn
    again on a scratch tensor (``post_init`` overwrites the values; the draws move the stream), and each
    ``post_init``'s ``initialize_weights`` applied where it ran (a sub-model's, such as ``LlamaModel``
    inside ``LlamaForCausalLM``, before the rest of the outer model is constructed)."""
    from transformers import initialization

    done: set[str] = set()
    for event in events:
        if event[0] == "draw":
            _, func, shape, dtype, args, kwargs = event
            func(torch.empty(shape, dtype=dtype), *args, **kwargs)
            continue
        path = event[1]
        module = model.get_submodule(path)
        with initialization.guard_torch_init_functions():
            yield from _initialize(path, module, module, done, constructed)
        done.add(path)
