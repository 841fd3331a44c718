// libFuzzer target for tokenizer.json's reader (fsdp/tokenizers/tokenizer.h):
// fuzz_tokenizer of scripts/fuzz.sh, a file of its own (the checkpoint
// targets of checkpoint_fuzz.cpp link LibTorch; this one links only
// fsdp_tokenizers). The input is the text of a tokenizer.json. It is parsed; a tokenizer it
// accepts encodes a few fixed texts (Unicode, emoji, digits, white space,
// special tokens) with and without special tokens, decodes what it made
// keeping and skipping special tokens, and decodes every id of its vocab
// (up to 512). An fsdp::Error (the ConfigError that names the file and the
// key) is the expected outcome of bad input; a crash, a hang, an
// out-of-bounds access (AddressSanitizer), any other exception, or an
// allocation beyond libFuzzer's -malloc_limit_mb is a finding.
//
// With FSDP_FUZZ_SEEDS=<dir> in the environment, the target first writes
// its seed corpus into <dir>: small tokenizer.json files in the layouts of
// Llama 3 (Split + ByteLevel, ignore_merges, a BOS template), GPT-2
// (ByteLevel's regex, merges as strings, lstrip/rstrip/single_word added
// tokens), Llama 2 (Prepend and Replace normalizers, byte_fallback,
// fuse_unk, ByteFallback/Fuse/Strip decoders), Mistral (Metaspace) and the
// other Split behaviours.
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include "fsdp/error.h"
#include "fsdp/tokenizers/tokenizer.h"

namespace {

const char* const kTexts[] = {
    "",
    "Hello world! I'm here, DON'T go; they'll see 1234567 apples.",
    "  leading\ttabs\n\nand\r\nwindows  trailing   ",
    "caf\xC3\xA9 e\xCC\x81 \xE4\xBD\xA0\xE5\xA5\xBD \xD0\x9F\xD1\x80\xD0\xB8 \xD9\x85\xD8\xB1",
    "\xF0\x9F\x98\x80\xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD \xF0\x9F\x87\xAB\xF0\x9F\x87\xB7 \xE2\x96\x81x",
    "<|begin_of_text|>hi<|eot_id|> <s>a</s><unk> <mask> [NEW] x[NEW]",
};

const char* const kSeeds[] = {
    // Llama 3's pipeline.
    R"({"version":"1.0","truncation":null,"padding":null,
"added_tokens":[{"id":9,"content":"<|begin_of_text|>","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":true},
{"id":10,"content":"<|eot_id|>","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":true}],
"normalizer":null,
"pre_tokenizer":{"type":"Sequence","pretokenizers":[{"type":"Split","pattern":{"Regex":"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},"behavior":"Isolated","invert":false},
{"type":"ByteLevel","add_prefix_space":false,"trim_offsets":true,"use_regex":false}]},
"post_processor":{"type":"Sequence","processors":[{"type":"ByteLevel","add_prefix_space":true,"trim_offsets":false,"use_regex":true},
{"type":"TemplateProcessing","single":[{"SpecialToken":{"id":"<|begin_of_text|>","type_id":0}},{"Sequence":{"id":"A","type_id":0}}],
"pair":[],"special_tokens":{"<|begin_of_text|>":{"id":"<|begin_of_text|>","ids":[9],"tokens":["<|begin_of_text|>"]}}}]},
"decoder":{"type":"ByteLevel","add_prefix_space":true,"trim_offsets":true,"use_regex":true},
"model":{"type":"BPE","dropout":null,"unk_token":null,"continuing_subword_prefix":null,"end_of_word_suffix":null,"fuse_unk":false,
"byte_fallback":false,"ignore_merges":true,"vocab":{"H":0,"e":1,"l":2,"o":3,"He":4,"ll":5,"Hell":6,"Ġ":7,"Ġworld":8},
"merges":[["H","e"],["l","l"],["He","ll"]]}})",
    // GPT-2's.
    R"({"version":"1.0","added_tokens":[{"id":7,"content":"<|endoftext|>","single_word":false,"lstrip":false,"rstrip":false,"normalized":true,"special":true},
{"id":8,"content":"<mask>","single_word":false,"lstrip":true,"rstrip":false,"normalized":false,"special":true},
{"id":9,"content":"[NEW]","single_word":true,"lstrip":false,"rstrip":true,"normalized":false,"special":false}],
"normalizer":null,"pre_tokenizer":{"type":"ByteLevel","add_prefix_space":true,"trim_offsets":true,"use_regex":true},
"post_processor":{"type":"ByteLevel","add_prefix_space":true,"trim_offsets":false,"use_regex":true},
"decoder":{"type":"ByteLevel","add_prefix_space":true,"trim_offsets":true,"use_regex":true},
"model":{"type":"BPE","dropout":null,"unk_token":null,"continuing_subword_prefix":"","end_of_word_suffix":"","fuse_unk":false,
"vocab":{"Ġ":0,"h":1,"i":2,"Ġh":3,"Ġhi":4,"Ã":5,"©":6},"merges":["Ġ h","Ġh i"]}})",
    // Llama 2's (Hugging Face's converter).
    R"({"version":"1.0","added_tokens":[{"id":0,"content":"<unk>","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":true},
{"id":1,"content":"<s>","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":true},
{"id":2,"content":"</s>","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":true}],
"normalizer":{"type":"Sequence","normalizers":[{"type":"Prepend","prepend":"▁"},{"type":"Replace","pattern":{"String":" "},"content":"▁"}]},
"pre_tokenizer":null,
"post_processor":{"type":"TemplateProcessing","single":[{"SpecialToken":{"id":"<s>","type_id":0}},{"Sequence":{"id":"A","type_id":0}}],
"pair":[],"special_tokens":{"<s>":{"id":"<s>","ids":[1],"tokens":["<s>"]}}},
"decoder":{"type":"Sequence","decoders":[{"type":"Replace","pattern":{"String":"▁"},"content":" "},{"type":"ByteFallback"},{"type":"Fuse"},
{"type":"Strip","content":" ","start":1,"stop":0}]},
"model":{"type":"BPE","dropout":null,"unk_token":"<unk>","continuing_subword_prefix":null,"end_of_word_suffix":null,"fuse_unk":true,
"byte_fallback":true,"vocab":{"<unk>":0,"<s>":1,"</s>":2,"<0x41>":3,"<0xC3>":4,"<0xA9>":5,"▁":6,"h":7,"i":8,"▁h":9,"▁hi":10},
"merges":["▁ h","▁h i"]}})",
    // Mistral's (Metaspace) and a regex Replace decoder.
    R"({"version":"1.0","added_tokens":[{"id":1,"content":"<s>","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":true}],
"normalizer":null,"pre_tokenizer":{"type":"Metaspace","replacement":"▁","prepend_scheme":"first","split":true},
"post_processor":null,
"decoder":{"type":"Sequence","decoders":[{"type":"Metaspace","replacement":"▁","prepend_scheme":"always","split":true},
{"type":"Replace","pattern":{"Regex":"\\s+"},"content":" "}]},
"model":{"type":"BPE","unk_token":null,"byte_fallback":true,"vocab":{"<s>":1,"▁":0,"x":2,"▁x":3,"<0x20>":4},"merges":[["▁","x"]]}})",
    // The other Split behaviours, NFC, no decoder, a two-id template token.
    R"({"version":"1.0","added_tokens":[{"id":5,"content":"[CLS]","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":true}],
"normalizer":{"type":"Sequence","normalizers":[{"type":"NFC"},{"type":"Replace","pattern":{"Regex":"\\d{4,}"},"content":"#"}]},
"pre_tokenizer":{"type":"Sequence","pretokenizers":[{"type":"Split","pattern":{"String":" "},"behavior":"MergedWithNext","invert":false},
{"type":"Split","pattern":{"Regex":"\\p{N}"},"behavior":"Contiguous","invert":false},
{"type":"Split","pattern":{"Regex":"[,.!?]"},"behavior":"MergedWithPrevious","invert":false},
{"type":"Split","pattern":{"Regex":"[^q]+"},"behavior":"Removed","invert":true},
{"type":"Split","pattern":{"Regex":"\\s*"},"behavior":"Isolated","invert":false}]},
"post_processor":{"type":"TemplateProcessing","single":[{"SpecialToken":{"id":"[CLS]","type_id":0}},{"Sequence":{"id":"A","type_id":0}},
{"SpecialToken":{"id":"[CLS]","type_id":0}}],"pair":[],"special_tokens":{"[CLS]":{"id":"[CLS]","ids":[5,5],"tokens":["[CLS]","[CLS]"]}}},
"decoder":null,
"model":{"type":"BPE","vocab":{"a":0,"b":1,"ab":2," ":3,"1":4},"merges":["a b"]}})",
};

void write_seeds(const std::string& dir) {
  int i = 0;
  for (const char* seed : kSeeds) {
    std::ofstream(dir + "/seed" + std::to_string(i++) + ".json", std::ios::binary) << seed;
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  if (const char* seeds = std::getenv("FSDP_FUZZ_SEEDS")) write_seeds(seeds);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::unique_ptr<fsdp::tokenizers::Tokenizer> tok;
  try {
    tok = fsdp::tokenizers::hf_tokenizer_from_json(std::string_view(reinterpret_cast<const char*>(data), size),
                                                   "fuzz/tokenizer.json");
  } catch (const fsdp::Error&) {
    return 0;
  }
  for (const char* text : kTexts) {
    try {
      for (bool special : {true, false}) {
        const std::vector<int64_t> ids = tok->encode(text, special);
        tok->decode(ids, false);
        tok->decode(ids, true);
      }
    } catch (const fsdp::Error&) {
    }
  }
  std::vector<int64_t> all;
  for (int64_t id = 0; id < tok->vocab_size() + 2 && id < 512; ++id) all.push_back(id);
  try {
    tok->decode(all, false);
    tok->decode(all, true);
  } catch (const fsdp::Error&) {
  }
  tok->token_to_id("a");
  tok->id_to_token(0);
  return 0;
}
