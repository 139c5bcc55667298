"""Training data from a flat token file, memory-mapped: each data-parallel rank reads only its rows.

The file is what nanoGPT's ``prepare.py`` writes (the token ids of the whole corpus, back to back, as
raw ``uint16``; no header) or a Megatron-LM indexed dataset's ``.bin`` (the same layout; its ``.idx``
says the dtype: ``MMIDIDX\\x00\\x00``, version ``<Q``, dtype code ``<B``, 8 = uint16, 4 = int32). Without
an ``.idx`` the dtype is ``uint16`` if the vocabulary fits in it and ``uint32`` otherwise, or what
``dtype=`` says. Document boundaries are ignored: the corpus is one stream (nanoGPT and Megatron's GPT
dataset both train on packed windows).

The stream is cut into windows of ``seq_len + 1`` tokens with stride ``seq_len`` (Megatron's samples:
window i is tokens ``[i * seq_len, (i + 1) * seq_len + 1)``; its last token is the next window's first
input). Step ``n`` (1-based) takes the ``global_batch`` windows from position ``p = (n - 1) *
global_batch`` on, wrapping around at the end of the file (epoch after epoch, in order). Of those, dp
rank ``r`` reads rows ``[r * local, (r + 1) * local)``, ``local = global_batch / dp``, exactly the rows
``PlannedModule.local_batch`` takes from a global batch; context-parallel ranks of the same dp rank read
the same rows and keep their tokens of each (``pm.sequence.take``).

Reading is deterministic and resumable: the position is a number of windows, which a checkpoint
stores (``train.data.position``), and a resumed run reads on from it: the same token stream as a run
that never stopped. ``pm.dp_rank`` / ``pm.dp_size`` are what a user's own loader needs to do the same.
"""
from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist

from ..ir import PlanError

MEGATRON_MAGIC = b"MMIDIDX\x00\x00"
MEGATRON_DTYPES = {1: torch.uint8, 2: torch.int8, 3: torch.int16, 4: torch.int32, 5: torch.int64, 8: torch.uint16}
DTYPES = {"uint16": torch.uint16, "uint32": torch.uint32, "int32": torch.int32}
CHECK_CHUNK = 1 << 24  # tokens per read when checking ids against the vocabulary


class DataError(PlanError):
    """A token file that is missing, unreadable, too short, or holds ids outside the vocabulary."""


def token_dtype(path: str | os.PathLike, vocab: int, dtype: str | None = None) -> torch.dtype:
    """The dtype of the token file ``path``: ``dtype`` if given, a Megatron ``.idx`` beside it if there
    is one, else uint16 when ``vocab`` fits in it (nanoGPT's choice) and uint32 when it does not."""
    if dtype is not None:
        if dtype not in DTYPES:
            raise DataError(f"--data-dtype is {dtype!r} but must be one of {', '.join(DTYPES)} "
                            "(the integer type the token file was written with)")
        return DTYPES[dtype]
    index = Path(path).with_suffix(".idx")
    if index.is_file():
        with index.open("rb") as f:
            head = f.read(len(MEGATRON_MAGIC) + 9)
        if head[:len(MEGATRON_MAGIC)] == MEGATRON_MAGIC and len(head) == len(MEGATRON_MAGIC) + 9:
            code = struct.unpack("<B", head[-1:])[0]
            if code not in MEGATRON_DTYPES:
                raise DataError(f"the Megatron index {index} has dtype code {code}, which is not an integer type "
                                f"({', '.join(f'{c}={_name(t)}' for c, t in MEGATRON_DTYPES.items())})")
            return MEGATRON_DTYPES[code]
    return torch.uint16 if vocab <= 1 << 16 else torch.uint32


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


@dataclass
class TokenFile:
    """A flat file of token ids, memory-mapped (nothing is read until a batch asks for it)."""

    path: Path
    vocab: int
    dtype: torch.dtype
    tokens: torch.Tensor = field(repr=False)  # 1-D, backed by the file (torch.from_file: mmap, read lazily)

    @classmethod
    def open(cls, path: str | os.PathLike, vocab: int, dtype: str | None = None) -> TokenFile:
        """Raises ``DataError`` if ``path`` is not a readable file of whole tokens."""
        path = Path(path)
        if not path.exists():
            raise DataError(f"--data {path} does not exist; give a token file (nanoGPT's train.bin or a Megatron "
                            "dataset's .bin), or omit --data to train on synthetic tokens")
        if not path.is_file():
            raise DataError(f"--data {path} is not a file; give a flat token file such as nanoGPT's train.bin")
        kind = token_dtype(path, vocab, dtype)
        size = path.stat().st_size
        if size == 0 or size % kind.itemsize:
            raise DataError(f"--data {path} has {size} bytes, not a whole number of {_name(kind)} tokens "
                            f"({kind.itemsize} bytes each); give the file's dtype with --data-dtype")
        # shared=False maps the file privately: pages are read when a batch touches them, never written
        return cls(path, vocab, kind, torch.from_file(str(path), shared=False, size=size // kind.itemsize, dtype=kind))

    def __len__(self) -> int:
        return len(self.tokens)

    def windows(self, seq_len: int) -> int:
        """How many windows of ``seq_len + 1`` tokens (stride ``seq_len``) the file holds."""
        return (len(self.tokens) - 1) // seq_len

    def rows(self, first: int, count: int, seq_len: int) -> torch.Tensor:
        """Windows ``first, ..., first + count - 1`` (modulo the file's windows) as int64 ``(count, seq_len + 1)``."""
        n = self.windows(seq_len)
        out = torch.empty((count, seq_len + 1), dtype=torch.int64)
        for i in range(count):
            start = (first + i) % n * seq_len
            out[i] = self.tokens[start:start + seq_len + 1].to(torch.int64)
        return out

    def check(self, global_batch: int, seq_len: int) -> None:
        """Raise ``DataError`` if the file holds fewer than one global batch of windows, or an id that is
        not below the vocabulary (naming the first such token's offset). Each rank of a process group
        reads its own part of the file (in chunks) and every rank gets the same verdict. A collective."""
        need = global_batch * seq_len + 1
        if len(self.tokens) < need:
            raise DataError(f"--data {self.path} holds {len(self.tokens)} tokens but one step needs at least "
                            f"{need} (global batch {global_batch} x seq_len {seq_len} + 1); give a larger file")
        rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
        share = -(-len(self.tokens) // world)
        bad = _first_out_of_range(self.tokens, rank * share, min((rank + 1) * share, len(self.tokens)), self.vocab)
        if dist.is_initialized():
            found = torch.tensor([bad if bad is not None else -1], dtype=torch.int64)
            gathered = [torch.zeros_like(found) for _ in range(world)]
            dist.all_gather(gathered, found)
            offsets = [int(t.item()) for t in gathered if int(t.item()) >= 0]
            bad = min(offsets) if offsets else None
        if bad is not None:
            raise DataError(f"--data {self.path} holds token id {int(self.tokens[bad:bad + 1].to(torch.int64))} at token {bad}, but the "
                            f"model's vocabulary has {self.vocab} ids (0..{self.vocab - 1}); tokenize with the model's "
                            f"tokenizer, or give the file's dtype with --data-dtype (read as {_name(self.dtype)})")


def _first_out_of_range(tokens: torch.Tensor, start: int, stop: int, vocab: int) -> int | None:
    """The offset of the first id in ``tokens[start:stop]`` outside ``[0, vocab)``, read in chunks."""
    for lo in range(start, stop, CHECK_CHUNK):
        chunk = tokens[lo:min(lo + CHECK_CHUNK, stop)].to(torch.int64)  # uint16/uint32 have few kernels
        bad = (chunk >= vocab) | (chunk < 0)
        if chunk.numel() and bool(bad.any()):
            return lo + int(bad.nonzero()[0, 0])
    return None


@dataclass
class TokenStream:
    """This data-parallel rank's rows of each step's global batch, read from a ``TokenFile``.

    ``position`` counts the windows every rank together has consumed; ``next_batch`` returns this rank's
    ``(inputs, targets)`` (``(local, seq_len)`` each) and advances it by ``global_batch``."""

    file: TokenFile
    global_batch: int
    seq_len: int
    dp_rank: int = 0
    dp_size: int = 1
    position: int = 0

    def batch_at(self, position: int) -> tuple[torch.Tensor, torch.Tensor]:
        local = self.global_batch // self.dp_size
        rows = self.file.rows(position + self.dp_rank * local, local, self.seq_len)
        return rows[:, :-1], rows[:, 1:]

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        batch = self.batch_at(self.position)
        self.position += self.global_batch
        return batch

    def seek_step(self, steps_done: int) -> None:
        """Continue after ``steps_done`` steps (the position of a checkpoint without one stored)."""
        self.position = steps_done * self.global_batch


def step_batch(file: TokenFile, step: int, global_batch: int, seq_len: int, dp_rank: int, dp_size: int
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """Step ``step``'s (1-based) rows for dp rank ``dp_rank``: what a ``TokenStream`` started at position
    0 returns on its ``step``-th call (the emitted script's reader)."""
    stream = TokenStream(file, global_batch, seq_len, dp_rank, dp_size)
    return stream.batch_at((step - 1) * global_batch)


def open_stream(path: str | os.PathLike, pm, *, dtype: str | None = None) -> TokenStream:
    """A checked ``TokenStream`` over ``path`` for the ``PlannedModule`` ``pm`` (its vocabulary, batch and
    dp rank). A collective (``TokenFile.check``): call it on every rank before the first step."""
    program = pm.program
    file = TokenFile.open(path, int(program.config["vocab"]), dtype)
    file.check(program.global_batch, program.seq_len)
    return TokenStream(file, program.global_batch, program.seq_len, pm.dp_rank, pm.dp_size)
