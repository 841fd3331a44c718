// Uses the installed fsdp::tokenizers alone (no LibTorch in this program):
// loads a tokenizer.json and encodes and decodes a text.
#include <fsdp/tokenizers/tokenizer.h>

#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "tokenizer_fixture.h"

int main() {
  const std::string dir = write_tokenizer_dir();
  auto tok = fsdp::tokenizers::load_tokenizer(dir);
  const std::vector<int64_t> ids = tok->encode("ababa");
  const bool ok = ids == std::vector<int64_t>{2, 2, 0} && tok->decode(ids) == "ababa" && tok->vocab_size() == 3;
  std::cout << "tokenizer consumer: " << (ok ? "ok" : "WRONG") << std::endl;
  std::system(("rm -rf '" + dir + "'").c_str());
  return ok ? 0 : 1;
}
