#include "files.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "fsdp/error.h"

namespace fsdp::tokenizers::detail {

std::string read_tokenizer_file(const std::string& path, const char* what, int64_t max_bytes) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (ec || !fs::exists(st)) {
    throw ConfigError("tokenizer: " + path + ": no such file (expected " + what + ")");
  }
  if (!fs::is_regular_file(st)) {
    throw ConfigError("tokenizer: " + path + ": not a regular file (expected " + what + ")");
  }
  const auto size = fs::file_size(path, ec);
  if (ec) throw ConfigError("tokenizer: " + path + ": cannot read its size: " + ec.message());
  if (size > static_cast<uintmax_t>(max_bytes)) {
    throw ConfigError("tokenizer: " + path + ": " + std::to_string(size) + " bytes, over the limit of " +
                      std::to_string(max_bytes) + " (expected " + what + ", and real ones are far smaller)");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError("tokenizer: " + path + ": cannot open: " + std::strerror(errno));
  std::string bytes(static_cast<size_t>(size), '\0');
  in.read(bytes.data(), static_cast<std::streamsize>(size));
  if (in.gcount() != static_cast<std::streamsize>(size)) {
    throw ConfigError("tokenizer: " + path + ": read " + std::to_string(in.gcount()) + " of " + std::to_string(size) +
                      " bytes (the file changed while it was read?)");
  }
  return bytes;
}

}  // namespace fsdp::tokenizers::detail
