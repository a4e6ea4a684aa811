"""What the engine needs from a checkpoint family: the members every module in this folder defines (s1.py is the
one there is). The registry (__init__.py) checks each family against `Family` when it is imported, so a family
that lacks a member fails at import, naming what it lacks, instead of when a load or a request first reaches it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

from torch import Tensor

from ..dual_ar_config import DualARConfig
from ..state_dict import StateDict
from ..tokenizer import Tokenizer


@dataclass(frozen=True)
class GenerationRules:
    """How a family generates; the engine reads these instead of hard-coding them."""

    penalty_window: int  # frames of history the repetition penalty looks at
    prompt_reserve: int  # a prompt may use at most max_seq_len - this many positions
    # parameter ranges of the family's request model, and its defaults
    temperature_range: tuple[float, float]
    top_p_range: tuple[float, float]
    repetition_penalty_range: tuple[float, float]
    default_temperature: float
    default_top_p: float
    default_repetition_penalty: float
    default_max_new_tokens: int


@runtime_checkable
class Family(Protocol):
    """A family is a module: these are its module-level names (the methods are its functions, without self)."""

    NAME: str  # in logs, `info` and error messages
    REQUIRED_FILES: tuple[str, ...]  # files a model directory must hold
    MODEL_FILES: tuple[str, ...]  # the DualAR's weights: the first of these that exists
    CODEC_FILES: tuple[str, ...]  # the codec's weights: likewise
    RULES: GenerationRules

    def matches(self, model_dir: Path) -> bool:
        """Whether the model directory (which has a config.json) holds a checkpoint of this family."""
        ...

    def load_config(self, model_dir: Path) -> DualARConfig: ...

    def load_tokenizer(self, model_dir: Path) -> Tokenizer: ...

    def normalize_model_keys(self, sd: StateDict) -> StateDict:
        """The model file's state dict in the DualAR's names and forms."""
        ...

    def normalize_codec_keys(self, sd: StateDict) -> StateDict:
        """The codec file's state dict in the Codec's names and forms."""
        ...

    def build_prompt(self, tokenizer: Tokenizer, num_codebooks: int, text: str,
                     references: list[tuple[str, Tensor]], allow_special: bool) -> Tensor:
        """The prompt of `text` spoken like the references ((text, codes [n, F]) pairs). -> int64 [n+1, T]"""
        ...

    def build_prefix(self, tokenizer: Tokenizer, num_codebooks: int, references: list[tuple[str, Tensor]],
                     allow_special: bool) -> Tensor:
        """The first columns of every build_prompt with these references, whatever the text. -> int64 [n+1, P]"""
        ...


METHODS = tuple(sorted(name for name, value in vars(Family).items() if callable(value) and not name.startswith("_")))
MEMBERS = tuple(sorted({*Family.__annotations__, *METHODS}))


def check(family: object) -> Family:
    """`family` if it has every member of Family (the methods callable), else a TypeError of one line naming the
    family and what it lacks."""
    lacking = [name for name in MEMBERS if not hasattr(family, name)]
    lacking += [f"{name} (not callable)" for name in METHODS
                if hasattr(family, name) and not callable(getattr(family, name))]
    if lacking:
        label = getattr(family, "__name__", None) or type(family).__name__
        if isinstance(getattr(family, "NAME", None), str):
            label = f"{family.NAME!r} ({label})"
        raise TypeError(f"checkpoint family {label} lacks {', '.join(lacking)} (model/families/family.py lists "
                        "what a family defines)")
    return family  # type: ignore[return-value]  # a module satisfies the Protocol structurally
