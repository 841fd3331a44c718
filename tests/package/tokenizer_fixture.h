// The consumer's tokenizer: the smallest tokenizer.json (a byte-level BPE
// over "a" and "b", "ab" merged), written into a fresh directory.
#pragma once

#include <stdlib.h>

#include <fstream>
#include <string>

inline std::string write_tokenizer_dir() {
  char tmpl[] = "/tmp/fsdp-consumer-XXXXXX";
  const std::string dir = ::mkdtemp(tmpl);
  std::ofstream(dir + "/tokenizer.json") << R"({"version": "1.0", "added_tokens": [], "normalizer": null,
    "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
    "post_processor": null, "decoder": {"type": "ByteLevel"},
    "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"]}})";
  std::ofstream(dir + "/in.txt") << "ababa";
  return dir;
}
