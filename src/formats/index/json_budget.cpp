// The bounded JSON pass (check_json_budget): what a JSON text will cost
// once parsed, counted before the DOM is built.
#include <nlohmann/json.hpp>

#include <iterator>
#include <string>
#include <string_view>

#include "fsdp/error.h"
#include "fsdp/formats/format.h"

namespace fsdp::formats {

namespace {

using Json = nlohmann::ordered_json;

[[noreturn]] void bad(const std::string& where, const std::string& what) {
  throw ConfigError("checkpoint: " + where + ": " + what);
}

// nlohmann's SAX events, each charged what the DOM takes for it: a value
// (16 bytes) with its share of its array's growth (x2); a string's heap
// object and its characters beyond the inline buffer; an object member's map
// node (about 96 bytes) and its key; a container's heap object.
class JsonBudget : public nlohmann::json_sax<Json> {
 public:
  JsonBudget(std::string_view text, const std::string& where, const char* what)
      : text_(text), where_(where), what_(what), budget_(json_budget(text.size())) {}
  size_t charged() const { return charged_; }
  // Where the lexer is (ByteCounter moves it), for messages.
  const char* at = nullptr;

  bool null() override { return value(); }
  bool boolean(bool) override { return value(); }
  bool number_integer(number_integer_t) override { return value(); }
  bool number_unsigned(number_unsigned_t) override { return value(); }
  bool number_float(number_float_t, const string_t&) override { return value(); }
  bool string(string_t& s) override { return value(kHeapString + chars(s.size())); }
  bool binary(binary_t& b) override { return value(kHeapString + chars(b.size())); }
  bool start_object(std::size_t) override { return open(kHeapMap); }
  bool key(string_t& k) override { return charge(kMapNode + chars(k.size())); }
  bool end_object() override { return close(); }
  bool start_array(std::size_t) override { return open(kHeapVector); }
  bool end_array() override { return close(); }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override { return false; }

 private:
  static constexpr size_t kValue = 2 * sizeof(Json);
  static constexpr size_t kHeapString = 48, kHeapMap = 64, kHeapVector = 32, kMapNode = 96;
  static size_t chars(size_t n) { return n > 15 ? n + 9 : 0; }

  bool value(size_t extra = 0) { return charge(kValue + extra); }
  bool open(size_t heap) {
    if (++depth_ > kJsonMaxDepth) {
      bad(where_, std::string(what_) + " nests arrays and objects more than " + std::to_string(kJsonMaxDepth) +
                      " deep at byte " + offset() + " (expected a flat header; it is damaged or hostile)");
    }
    return value(heap);
  }
  bool close() {
    --depth_;
    return true;
  }
  std::string offset() const { return std::to_string(at ? at - text_.data() : 0); }
  bool charge(size_t n) {
    charged_ += n;
    if (charged_ > budget_) {
      bad(where_, std::string(what_) + " expands beyond what its size allows: parsing its " +
                      std::to_string(text_.size()) + " bytes would take more than " + std::to_string(budget_) +
                      " bytes of memory (" + std::to_string(kJsonBudgetSlack) + " + " +
                      std::to_string(kJsonBudgetPerByte) + " per byte) at byte " + offset() +
                      "; real files take far less, so it is damaged or hostile");
    }
    return true;
  }

  std::string_view text_;
  const std::string& where_;
  const char* what_;
  size_t budget_, charged_ = 0;
  int depth_ = 0;
};

// An input iterator over the text that tells JsonBudget where the lexer is.
struct ByteCounter {
  using iterator_category = std::input_iterator_tag;
  using value_type = char;
  using difference_type = std::ptrdiff_t;
  using pointer = const char*;
  using reference = const char&;
  const char* p;
  JsonBudget* budget;
  const char& operator*() const {
    budget->at = p;
    return *p;
  }
  ByteCounter& operator++() {
    ++p;
    return *this;
  }
  ByteCounter operator++(int) {
    ByteCounter old = *this;
    ++p;
    return old;
  }
  bool operator==(const ByteCounter& o) const { return p == o.p; }
  bool operator!=(const ByteCounter& o) const { return p != o.p; }
};

}  // namespace

size_t check_json_budget(std::string_view text, const std::string& where, const char* what) {
  JsonBudget budget(text, where, what);
  const char* begin = text.data();
  Json::sax_parse(ByteCounter{begin, &budget}, ByteCounter{begin + text.size(), &budget}, &budget);
  return budget.charged();
}

}  // namespace fsdp::formats
