// fsdp-tokenizer-load: the load of tokenizer.json files by fsdp::tokenizers,
// timed, for the comparison with Hugging Face's `tokenizers` in
// docs/performance.md ("Loading tokenizer.json"; bench/tokenizer_load.sh
// makes the files and times the Python side).
//
//   fsdp-tokenizer-load [--repeat N] FILE...
//
// Prints one JSON line per file: {"peer": "fsdp-cpp", "file", "seconds"
// (the fastest of --repeat loads: read, parse, build), "vocab_size"}.
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "fsdp/tokenizers/tokenizer.h"

int main(int argc, char** argv) {
  int repeat = 3;
  std::vector<std::string> files;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--repeat" && i + 1 < argc) {
      repeat = std::max(1, std::atoi(argv[++i]));
    } else {
      files.push_back(a);
    }
  }
  if (files.empty()) {
    std::cerr << "usage: fsdp-tokenizer-load [--repeat N] FILE...\n";
    return 2;
  }
  try {
    for (const std::string& f : files) {
      double best = 1e300;
      int64_t vocab = 0;
      for (int r = 0; r < repeat; ++r) {
        const auto start = std::chrono::steady_clock::now();
        auto tok = fsdp::tokenizers::load_tokenizer(f);
        best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
        vocab = tok->vocab_size();
      }
      std::cout << "{\"peer\": \"fsdp-cpp\", \"file\": \"" << f << "\", \"seconds\": " << best
                << ", \"vocab_size\": " << vocab << "}" << std::endl;
    }
  } catch (const std::exception& e) {
    std::cerr << "fsdp-tokenizer-load: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
