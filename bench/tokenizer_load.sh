#!/bin/sh
# The tokenizer.json load benchmark of docs/performance.md ("Loading
# tokenizer.json"): fsdp::tokenizers (fsdp-tokenizer-load) beside Hugging
# Face's `tokenizers` (Tokenizer.from_file, the venv's) on the same generated
# files, the fastest of 3 loads in one process each (read, parse, build; not
# the process's start), printed as a table:
#   added-N.json     a small byte-level BPE with N added tokens (N = 10k, 30k,
#                    100k; every other one special);
#   template-1M.json the same BPE with a TemplateProcessing of 10^6
#                    SpecialToken pieces around the sequence.
# Both sides must agree on each file's vocabulary size (checked).
# Needs build/bin/fsdp-tokenizer-load (scripts/build.sh --target fsdp-tokenizer-load).
#
#   bench/tokenizer_load.sh [WORK_DIR]   (default /tmp/fsdp-tokenizer-bench; ~60 MB there)
set -eu
cd "$(dirname "$0")/.."
work=${1:-/tmp/fsdp-tokenizer-bench}
py=.venv/bin/python
bin=build/bin
mkdir -p "$work"
$py - "$work" <<'PY'
import json, os, sys
out = sys.argv[1]
def base():
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": [], "normalizer": None,
            "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
            "post_processor": None,
            "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
            "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                      "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                      "vocab": {"a": 0, "b": 1, "ab": 2, "\u0120": 3}, "merges": ["a b"]}}
for n in (10_000, 30_000, 100_000):
    t = base()
    t["added_tokens"] = [{"id": 4 + i, "content": "<t%d>" % i, "single_word": False, "lstrip": False,
                          "rstrip": False, "normalized": False, "special": i % 2 == 0} for i in range(n)]
    with open(os.path.join(out, "added-%dk.json" % (n // 1000)), "w") as f:
        json.dump(t, f)
t = base()
single = [{"SpecialToken": {"id": "ab"[i % 2], "type_id": 0}} for i in range(1_000_000)]
single.insert(500_000, {"Sequence": {"id": "A", "type_id": 0}})
t["post_processor"] = {"type": "TemplateProcessing", "single": single, "pair": [],
                       "special_tokens": {c: {"id": c, "ids": [i], "tokens": [c]} for i, c in enumerate("ab")}}
with open(os.path.join(out, "template-1M.json"), "w") as f:
    json.dump(t, f)
PY
files="$work/added-10k.json $work/added-30k.json $work/added-100k.json $work/template-1M.json"
$bin/fsdp-tokenizer-load --repeat 3 $files > "$work/fsdp-cpp.jsonl"
$py - "$work/fsdp-cpp.jsonl" $files <<'PY'
import json, os, sys, time
from tokenizers import Tokenizer
ours = {r["file"]: r for r in map(json.loads, open(sys.argv[1]))}
print("| file | fsdp-cpp s | tokenizers s | vocab size |")
print("| --- | --- | --- | --- |")
for f in sys.argv[2:]:
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        tok = Tokenizer.from_file(f)
        best = min(best, time.perf_counter() - start)
    if tok.get_vocab_size() != ours[f]["vocab_size"]:
        sys.exit("%s: vocabulary size %d (tokenizers) vs %d (fsdp-cpp)" % (f, tok.get_vocab_size(), ours[f]["vocab_size"]))
    print("| %s | %.3f | %.3f | %d |" % (os.path.basename(f), ours[f]["seconds"], best, tok.get_vocab_size()))
PY
