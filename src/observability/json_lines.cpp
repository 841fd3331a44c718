// The JSON-lines reader (fsdp/observability/json_lines.h): a whole file for
// a resume, or the tail of one up to a step. (number_json, the writers' side,
// is in loggers.cpp, beside format_number.)
#include "fsdp/observability/json_lines.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <vector>

#include "fsdp/error.h"

namespace fsdp::detail {

using Json = nlohmann::ordered_json;

namespace {

int64_t step_value(const Json& value, const char* what) {
  if (!value.is_number_integer() || value.get<int64_t>() < 0) {
    throw std::invalid_argument(std::string(what) + " is not a step (a non-negative integer)");
  }
  return value.get<int64_t>();
}

// `line` as a record; std::invalid_argument saying why it is not one.
JsonLine parse_line(const std::string& line) {
  Json object;
  try {
    object = Json::parse(line);
  } catch (const Json::parse_error& e) {
    throw std::invalid_argument(std::string("not JSON (") + e.what() + ")");
  }
  if (!object.is_object()) throw std::invalid_argument("not a JSON object");
  JsonLine m;
  if (const auto gap = object.find("gap"); gap != object.end()) {
    if (!gap->is_array() || gap->size() != 2) throw std::invalid_argument("\"gap\" is not [first, last]");
    const int64_t first = step_value((*gap)[0], "\"gap\"'s first"), last = step_value((*gap)[1], "\"gap\"'s last");
    if (first < 1 || last < first) throw std::invalid_argument("\"gap\" is not [first, last] with 1 <= first <= last");
    m.gap.emplace(first, last);
    m.step = last;
    return m;
  }
  const auto step = object.find("step");
  if (step == object.end()) {
    if (object.contains("hparams")) return m;  // step 0: before every step
    throw std::invalid_argument("has no \"step\"");
  }
  m.step = step_value(*step, "\"step\"");
  return m;
}

// "'<up to 60 printable characters>'" of a damaged line, for messages.
std::string preview(const std::string& text) {
  std::string out;
  for (char ch : text.substr(0, 60)) out += (ch >= 32 && ch < 127) ? ch : '?';
  return "'" + out + (text.size() > 60 ? "...'" : "'");
}

}  // namespace

JsonLinesFile read_json_lines(const std::string& path) {
  JsonLinesFile out;
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return out;  // no file yet
  if (!S_ISREG(st.st_mode)) {
    throw ConfigError(path + " is not a regular file (a FIFO, device or directory); refusing to read it");
  }
  std::ifstream in(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), {});
  out.size = static_cast<int64_t>(bytes.size());
  int64_t lineno = 0;
  size_t pos = 0;
  while (pos < bytes.size()) {
    const size_t nl = bytes.find('\n', pos);
    if (nl == std::string::npos) break;  // a torn last line: not a line (see `end`)
    ++lineno;
    const std::string line = bytes.substr(pos, nl - pos);
    const auto offset = static_cast<int64_t>(pos);
    pos = nl + 1;
    out.end = static_cast<int64_t>(pos);
    if (line.empty()) continue;
    try {
      JsonLine m = parse_line(line);
      m.lineno = lineno;
      m.offset = offset;
      m.text = line;
      out.lines.push_back(std::move(m));
    } catch (const std::invalid_argument& e) {
      out.skipped.push_back({offset, "line " + std::to_string(lineno) + " (byte " + std::to_string(offset) +
                                         "): " + e.what() + ": " + preview(line)});
    }
  }
  if (static_cast<size_t>(out.end) < bytes.size()) {
    out.skipped.push_back({out.end, "a torn last line at byte " + std::to_string(out.end) + " (" +
                                        std::to_string(bytes.size() - static_cast<size_t>(out.end)) +
                                        " bytes without a newline): " +
                                        preview(bytes.substr(static_cast<size_t>(out.end)))});
  }
  return out;
}

JsonLinesTail read_json_lines_tail(int fd, int64_t size, int64_t up_to) {
  constexpr int64_t kChunk = int64_t{64} << 10, kLongest = int64_t{1} << 20;
  JsonLinesTail out;
  std::vector<char> chunk(static_cast<size_t>(kChunk));
  auto read_at = [&](int64_t offset, int64_t n) {
    int64_t done = 0;
    while (done < n) {
      const ssize_t got = ::pread(fd, chunk.data() + done, static_cast<size_t>(n - done), offset + done);
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) return false;
      done += got;
    }
    return true;
  };
  // The lines from the end: [start, content_end), each followed by '\n'
  // but the last, which is torn when the file does not end in one.
  int64_t end = size;
  bool last = true;
  while (end > 0) {
    int64_t content_end = end - 1;  // the '\n' that ends the line
    bool torn = false;
    if (last) {
      if (!read_at(size - 1, 1)) return out;
      torn = chunk[0] != '\n';
      if (torn) content_end = size;
    }
    last = false;
    // Back to the line's start, holding at most kLongest of its bytes.
    std::vector<std::string> pieces;  // from the end
    int64_t held = 0, cursor = content_end, start = 0;
    bool too_long = false;
    while (cursor > 0) {
      const int64_t n = std::min(kChunk, cursor);
      if (!read_at(cursor - n, n)) return out;
      const void* nl = ::memrchr(chunk.data(), '\n', static_cast<size_t>(n));
      const int64_t from = nl != nullptr ? static_cast<const char*>(nl) - chunk.data() + 1 : 0;
      if (!too_long) {
        if (held + (n - from) > kLongest) {
          too_long = true;
          pieces.clear();
        } else {
          pieces.emplace_back(chunk.data() + from, static_cast<size_t>(n - from));
          held += n - from;
        }
      }
      cursor -= n - from;
      if (nl != nullptr) {
        start = cursor;
        break;
      }
    }
    if (cursor == 0) start = 0;
    end = start;
    if (torn || too_long) {
      out.damaged = true;
      continue;
    }
    std::string text;
    text.reserve(static_cast<size_t>(held));
    for (auto it = pieces.rbegin(); it != pieces.rend(); ++it) text += *it;
    if (text.empty()) continue;  // a blank line
    try {
      const JsonLine m = parse_line(text);
      if (m.step <= up_to) {
        out.keep = content_end + 1;
        out.last_step = m.step;
        return out;
      }
    } catch (const std::invalid_argument&) {
      out.damaged = true;
    }
  }
  return out;
}

}  // namespace fsdp::detail
