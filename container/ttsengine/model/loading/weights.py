"""Reading state dicts safely (weights_only / safetensors) and loading them strictly.

A checkpoint that does not match the module is an error listing what is missing, unexpected or
mis-shaped; there is no silent non-strict load.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from torch import Tensor, nn

from ...compat import load_torch_file
from ...errors import CheckpointError
from ..state_dict import StateDict


def read_state_dict(path: Path) -> StateDict:
    """A `.pth`/`.pt` (plain or `{"state_dict": ...}`) or `.safetensors` file -> {name: tensor} on CPU."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: file not found")
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        try:
            obj: object = load_file(str(path), device="cpu")
        except Exception as e:  # safetensors raises its own error type for every format problem
            raise CheckpointError(f"{path}: not a readable safetensors file (truncated or corrupt?): {e}") from None
    else:
        obj = load_torch_file(path)
    if isinstance(obj, dict) and isinstance(obj.get("state_dict"), dict):
        obj = obj["state_dict"]
    if not isinstance(obj, dict) or not all(isinstance(k, str) and isinstance(v, Tensor) for k, v in obj.items()):
        raise CheckpointError(f"{path}: does not hold a state_dict (a mapping of names to tensors)")
    if not obj:
        raise CheckpointError(f"{path}: the state_dict is empty")
    return dict(obj)


def upstream_order(sd: StateDict) -> StateDict:
    """The same entries in upstream's file order: its transformer blocks (the DualAR's and the codec's) register
    `ffn_norm` before `attention_norm`, ours the other way round (for writing files like the real ones)."""
    keys = list(sd)
    for i, key in enumerate(keys):
        if key.endswith(".attention_norm.weight"):
            ffn = key[: -len("attention_norm.weight")] + "ffn_norm.weight"
            if ffn in sd and keys.index(ffn) > i:
                keys.remove(ffn)
                keys.insert(i, ffn)
    return {k: sd[k] for k in keys}


def _listing(names: list[str], limit: int = 12) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" ... and {len(names) - limit} more" if len(names) > limit else "")


def load_strict(module: nn.Module, sd: StateDict, what: str, ignore: Callable[[str], bool] = lambda k: False) -> None:
    """Assigns `sd` to `module` (keeping the file's tensors and dtype) after checking that names and
    shapes match exactly. `ignore` names file entries that are known and deliberately unused."""
    module.load_state_dict(check_strict(module, sd, what, ignore), strict=True, assign=True)


def check_strict(module: nn.Module, sd: StateDict, what: str, ignore: Callable[[str], bool] = lambda k: False
                 ) -> StateDict:
    """`sd` without the ignored entries, after checking that its names and shapes are exactly the module's
    (a CheckpointError listing what is missing, unexpected or mis-shaped otherwise)."""
    expected = module.state_dict()
    sd = {k: v for k, v in sd.items() if not (k not in expected and ignore(k))}
    missing = sorted(set(expected) - set(sd))
    unexpected = sorted(set(sd) - set(expected))
    wrong = sorted(
        f"{k} (file {list(sd[k].shape)}, model {list(expected[k].shape)})"
        for k in set(sd) & set(expected) if sd[k].shape != expected[k].shape
    )
    problems = []
    if missing:
        problems.append(f"missing {len(missing)}: {_listing(missing)}")
    if unexpected:
        problems.append(f"unexpected {len(unexpected)}: {_listing(unexpected)}")
    if wrong:
        problems.append(f"wrong shape {len(wrong)}: {_listing(wrong)}")
    if problems:
        raise CheckpointError(f"{what}: does not match the model config; " + "; ".join(problems))
    return sd


def fingerprint(module: nn.Module) -> str:
    """A short id of a module's weights: shapes of every tensor plus a sample of their values."""
    import hashlib

    h = hashlib.sha256()
    for name, t in module.state_dict().items():
        h.update(f"{name}{tuple(t.shape)}".encode())
        flat = t.detach().reshape(-1)
        if flat.numel():
            h.update(flat[:: max(1, flat.numel() // 64)][:64].float().cpu().numpy().tobytes())
    return h.hexdigest()[:16]
