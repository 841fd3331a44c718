#!/usr/bin/env python3
r"""The reference for fsdp::tokenizers (tests/tokenizers/tokenizer_test.cpp):
trains small tokenizers here, with no hub access, in the layouts of real
models' files, and writes what Hugging Face's `tokenizers` and Google's
`sentencepiece` make of a test corpus.

    make_tokenizers.py DIR
    make_tokenizers.py --char-classes FILE

The second form writes the code points that tokenizers' regex engine
(Oniguruma) matches with \s, \p{L}, \p{N} and [^\s\p{L}\p{N}], as ranges.
The first writes into DIR:
  llama3/tokenizer.json     byte-level BPE, Llama 3's pipeline: Split on Llama 3's
                            regex, ByteLevel without its regex, ignore_merges,
                            a BOS template, special tokens after the vocab, merges
                            as pairs; a few whole words in the vocab that the
                            merges do not reach (so ignore_merges matters)
  gpt2/tokenizer.json       byte-level BPE, GPT-2's: ByteLevel with GPT-2's regex,
                            merges as "a b" strings, <|endoftext|> (normalized),
                            and added tokens with lstrip, rstrip and single_word
  roberta/tokenizer.json    gpt2's model, ByteLevel with add_prefix_space
  qwen2/tokenizer.json      byte-level BPE, Qwen2's: NFC, Split on Qwen2's regex
  splits/tokenizer.json     gpt2's model behind every Split behaviour, invert,
                            a regex Replace normalizer, Prepend, a template with
                            a two-id token and a token after the sequence, and
                            no decoder
  sp_bpe/tokenizer.model    SentencePiece BPE with byte_fallback (Llama 2's kind)
  sp_unigram/tokenizer.model  SentencePiece unigram with byte_fallback
  llama2/tokenizer.json     sp_bpe as Hugging Face's converter writes Llama 2's:
                            Prepend and Replace normalizers, byte_fallback,
                            fuse_unk, ByteFallback/Fuse/Strip decoders
  mistral/tokenizer.json    sp_bpe in Mistral v0.3's layout: a Metaspace
                            pre-tokenizer (prepend_scheme first), no normalizer
  sp_metaspace/tokenizer.json  sp_bpe with Metaspace (always, split) as its
                            pre-tokenizer and its decoder
  llama3/ and qwen2/ also get a tokenizer_config.json (bos_token, eos_token)
  reference.json            {"tokenizers": [{"name", "path", "vocab_size", "bos",
                            "eos" (fsdp::tokenizers' rule: tokenizer_config.json,
                            else the template's first and last special tokens),
                            "token_ids": {token: id or null}, "id_tokens": {id:
                            token or null}, "cases":
                            [{"text", "ids", "ids_plain", "decoded",
                            "decoded_skip"}], "decodes": [{"ids", "decoded",
                            "decoded_skip"}]}]}
                            ids: encode(text) with the special tokens (the
                            template, or SentencePiece's BOS), ids_plain without;
                            decoded(_skip): decode(ids) keeping (skipping) the
                            special tokens; "decodes": decode of arbitrary ids
                            (broken UTF-8 and all).
"""
import json
import os
import random
import sys

import sentencepiece as spm
from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers, trainers

LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                r"\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
               r"\s*[\r\n]+|\s+(?!\S)|\s+")

# Training text: a few languages and scripts, code, numbers.
TRAIN = [
    "The quick brown fox jumps over the lazy dog. I'm sure they'll say it's fine, but we've seen worse.",
    "DON'T PANIC! It's 10:45 on 2024-03-17, and the temperature is -3.5 degrees.",
    "Fully sharded data parallel training splits parameters, gradients and optimizer state across ranks.",
    "def main(argv):\n    for i in range(10):\n        print(f\"step {i}: loss={loss:.4f}\")\n    return 0\n",
    "Le café est très chaud; l'élève a mangé une crème brûlée à Noël. Ça va?",
    "Über den Wolken muss die Freiheit wohl grenzenlos sein. Straße, Größe, Äpfel.",
    "El niño pidió una piña y un jalapeño en la mañana.",
    "Привет, мир! Как дела? Съешь же ещё этих мягких французских булок.",
    "Γειά σου Κόσμε. Η γρήγορη καφέ αλεπού.",
    "日本語のテキストも少し入れておきます。東京は大きな都市です。",
    "中文文本：我们正在训练一个小的分词器，用于测试。",
    "한국어 문장도 있습니다. 안녕하세요!",
    "مرحبا بالعالم، هذه جملة عربية للاختبار.",
    "שלום עולם, זה משפט בעברית.",
    "नमस्ते दुनिया, यह एक परीक्षण है।",
    "Emoji: 😀 😂 👍🏽 🇫🇷 🇯🇵 👨‍👩‍👧‍👦 ❤️ ✨",
    "Numbers: 0 1 12 123 1234 12345 123456 1234567 3.14159 2,718 1e-9",
    "    indented line\twith\ttabs  and   runs of    spaces   \r\nwindows line\r\n\n\nparagraph",
    "<html><body class=\"main\">Hello &amp; welcome</body></html>",
    "SELECT name, COUNT(*) FROM users WHERE age >= 21 GROUP BY name;",
    "https://example.com/path?query=value&other=1#anchor user@example.org",
]

# The corpus every tokenizer encodes: what the issue lists, then seeded random lines.
SPECIALS_IN_TEXT = "<|begin_of_text|>Hello<|eot_id|> world<|end_of_text|>"
CORPUS = [
    "",
    " ",
    "Hello world",
    "Hello, world! How are you today?",
    "The quick brown fox jumps over the lazy dog.",
    "I'm here. You're there. DON'T GO. It's HE'S. we'll, I'd, they've, ſ 's 'S 'ſ",
    "Zebra Quokka zebra Quokkas Axolotl",
    "café naïve résumé Ångström crème brûlée",
    "cafe\u0301 e\u0301le\u0300ve A\u030a \u1100\u1161\u11a8 \u0041\u0308\u0304",
    "Привет мир! Ёлка и ель.",
    "你好，世界！我们在测试。",
    "日本語のテキスト、カタカナ、ひらがな。",
    "مرحبا بالعالم",
    "Γειά σου Κόσμε",
    "😀😂👍🏽 🇫🇷🇯🇵 👨‍👩‍👧‍👦 ❤️ ✨🎉",
    "1234567 12345678901234567890 3.14159 1,000,000 -42 ٣٤٥ ๑๒๓",
    "a  b   c    d",
    "\ttab\tseparated\tvalues\t",
    "line one\nline two\n\nline four\r\nline five\r\n",
    "trailing spaces   ",
    "   leading spaces",
    "\n\n\n",
    "   \n  \t \r\n ",
    SPECIALS_IN_TEXT,
    "text <|eot_id|>\n<|start_header_id|>user<|end_header_id|>\n\nHi!",
    "<|endoftext|>GPT-2 end<|endoftext|> <|endoftext|>",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi<|im_end|>",
    "<s>hello</s> <unk> [INST] tell me [/INST]",
    "a <mask> b<mask>c  <mask>  d",
    "[NEWTOK] x[NEWTOK] [NEWTOK]y ([NEWTOK]) é[NEWTOK]",
    "hello world and hello worlds",
    "def f(x):\n    return x ** 2  # square\n",
    "    if (a != b && c <= d) { return; }",
    "email: someone@example.com, url: https://example.org/a?b=c",
    "ÿþ\u00a0nbsp\u3000ideographic\u2028line-sep\u0085nel\u200bzwsp\u00adshy",
    "\u0000\u0001\u001f\u007f control",
    "\U0001F600\U00010348\U0002A6D6 supplementary \uE000 private",
    "a" * 300,
    "x" + "😀" * 40,
    "word " * 50,
]


def random_lines(n, seed):
    """Seeded random text: code points from many blocks (letters, marks, digits, spaces, punctuation, CJK,
    emoji, controls), the special tokens, and runs of spaces and newlines."""
    rng = random.Random(seed)
    pools = [
        "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ", "0123456789", " ", "  ", "\t", "\n", "\r\n",
        "'", ".,;:!?-_()[]{}<>/\\\"@#$%^&*+=~`|", "éèêëàâäîïôöùûüçÉÀ", "привет", "你好世界中文", "😀👍🏽🇫🇷‍",
        "\u0301\u0308\u0327", "\u00a0\u2000\u3000\u2028\u0085\u200b", "٣٤٥१२३", "<|eot_id|>", "<|endoftext|>",
        "<mask>", "[NEWTOK]", "<s>", "'s", "'LL", "Zebra",
    ]
    lines = []
    for _ in range(n):
        parts = []
        for _ in range(rng.randint(1, 25)):
            if rng.random() < 0.15:
                parts.append(chr(rng.choice([rng.randint(0x20, 0x7e), rng.randint(0xa0, 0x2fff),
                                             rng.randint(0x3000, 0xd7ff), rng.randint(0xe000, 0xfffd),
                                             rng.randint(0x10000, 0x1faff)])))
            else:
                pool = rng.choice(pools)
                parts.append(pool if len(pool) <= 2 or pool.startswith(("<", "[", "'")) or pool == "Zebra"
                             else "".join(rng.choice(pool) for _ in range(rng.randint(1, 6))))
        lines.append("".join(parts))
    return lines


def train_byte_level_bpe(pre_tokenizer, vocab_size, normalizer=None):
    """A byte-level BPE trained on TRAIN and CORPUS with `pre_tokenizer`: (vocab, merges)."""
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tokenizer
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=1, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(TRAIN * 3 + CORPUS, trainer=trainer)
    model = json.loads(tok.to_str())["model"]
    return model["vocab"], [m if isinstance(m, list) else m.split(" ") for m in model["merges"]]


def added(id_, content, special=True, normalized=False, lstrip=False, rstrip=False, single_word=False):
    return {"id": id_, "content": content, "single_word": single_word, "lstrip": lstrip, "rstrip": rstrip,
            "normalized": normalized, "special": special}


def byte_level(add_prefix_space=False, trim_offsets=True, use_regex=True):
    return {"type": "ByteLevel", "add_prefix_space": add_prefix_space, "trim_offsets": trim_offsets,
            "use_regex": use_regex}


def template(bos, bos_id):
    return {
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                 {"SpecialToken": {"id": bos, "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {bos: {"id": bos, "ids": [bos_id], "tokens": [bos]}},
    }


def bpe_model(vocab, merges, ignore_merges=False, as_pairs=True, **kw):
    m = {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
         "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": ignore_merges,
         "vocab": vocab, "merges": merges if as_pairs else [" ".join(m) for m in merges]}
    m.update(kw)
    return m


def tokenizer_json(model, added_tokens, normalizer=None, pre_tokenizer=None, post_processor=None, decoder=None):
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added_tokens,
            "normalizer": normalizer, "pre_tokenizer": pre_tokenizer, "post_processor": post_processor,
            "decoder": decoder, "model": model}


def make_llama3():
    split = {"type": "Split", "pattern": {"Regex": LLAMA3_REGEX}, "behavior": "Isolated", "invert": False}
    vocab, merges = train_byte_level_bpe(pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_REGEX), "isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]), 1000)
    # Whole words the merges do not build: one token each only through ignore_merges.
    for word in ["ĠZebra", "ĠQuokka", "Zebra", "ĠAxolotl"]:
        if word not in vocab:
            vocab[word] = len(vocab)
    n = len(vocab)
    names = ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>", "<|reserved_special_token_1|>",
             "<|start_header_id|>", "<|end_header_id|>", "<|reserved_special_token_2|>", "<|eot_id|>"]
    specials = [added(n + i, s) for i, s in enumerate(names)]
    return tokenizer_json(
        bpe_model(vocab, merges, ignore_merges=True), specials,
        pre_tokenizer={"type": "Sequence", "pretokenizers": [split, byte_level(use_regex=False)]},
        post_processor={"type": "Sequence", "processors": [byte_level(trim_offsets=False),
                                                           template("<|begin_of_text|>", n)]},
        decoder=byte_level())


def make_gpt2(add_prefix_space):
    vocab, merges = train_byte_level_bpe(pre_tokenizers.ByteLevel(add_prefix_space=False), 800)
    n = len(vocab)
    tokens = [added(n, "<|endoftext|>", normalized=True),
              added(n + 1, "<mask>", lstrip=True),
              added(n + 2, "[NEWTOK]", special=False, single_word=True),
              added(n + 3, "hello world", special=False, normalized=True, rstrip=True)]
    return tokenizer_json(
        bpe_model(vocab, merges, as_pairs=False, continuing_subword_prefix="", end_of_word_suffix=""), tokens,
        pre_tokenizer=byte_level(add_prefix_space=add_prefix_space), post_processor=byte_level(),
        decoder=byte_level())


def make_qwen2():
    split = {"type": "Split", "pattern": {"Regex": QWEN2_REGEX}, "behavior": "Isolated", "invert": False}
    vocab, merges = train_byte_level_bpe(pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_REGEX), "isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]), 900, normalizers.NFC())
    n = len(vocab)
    specials = [added(n + i, s) for i, s in enumerate(["<|endoftext|>", "<|im_start|>", "<|im_end|>"])]
    return tokenizer_json(
        bpe_model(vocab, merges), specials, normalizer={"type": "NFC"},
        pre_tokenizer={"type": "Sequence", "pretokenizers": [split, byte_level(trim_offsets=False, use_regex=False)]},
        post_processor=byte_level(trim_offsets=False, use_regex=False),
        decoder=byte_level(trim_offsets=False, use_regex=False))


def make_splits():
    """gpt2's model behind the rest of what the pipeline offers: every Split behaviour, invert, a Replace
    normalizer with a regex, Prepend, a template with a two-id token and a token after the sequence, and no
    decoder (decode joins the tokens with spaces)."""
    vocab, merges = train_byte_level_bpe(pre_tokenizers.ByteLevel(add_prefix_space=False), 800)
    n = len(vocab)

    def split(pattern, behavior, invert=False):
        return {"type": "Split", "pattern": pattern, "behavior": behavior, "invert": invert}
    post = {
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": "[CLS]", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                   {"SpecialToken": {"id": "[SEP]", "type_id": 0}}],
        "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {"[CLS]": {"id": "[CLS]", "ids": [n, n + 1], "tokens": ["[CLS]", "[CLS]"]},
                           "[SEP]": {"id": "[SEP]", "ids": [n + 1], "tokens": ["[SEP]"]}},
    }
    return tokenizer_json(
        bpe_model(vocab, merges), [added(n, "[CLS]"), added(n + 1, "[SEP]"), added(n + 2, "<mask>", normalized=True)],
        normalizer={"type": "Sequence", "normalizers": [
            {"type": "NFC"}, {"type": "Replace", "pattern": {"Regex": r"\d{4,}"}, "content": "#"},
            {"type": "Prepend", "prepend": "»"}]},
        pre_tokenizer={"type": "Sequence", "pretokenizers": [
            split({"String": " "}, "MergedWithNext"), split({"Regex": r"\p{N}"}, "Contiguous"),
            split({"Regex": r"[,.!?]"}, "MergedWithPrevious"), split({"String": "x"}, "Removed"),
            split({"Regex": r"[^q]+"}, "Removed", invert=True), split({"Regex": r"\s*"}, "Isolated"),
            byte_level(add_prefix_space=True, use_regex=False)]},
        post_processor=post)


def train_sentencepiece(path_prefix, model_type, vocab_size, corpus_file):
    spm.SentencePieceTrainer.train(input=corpus_file, model_prefix=path_prefix, vocab_size=vocab_size,
                                   model_type=model_type, byte_fallback=True, character_coverage=0.995,
                                   minloglevel=2, num_threads=1, max_sentence_length=100000,
                                   split_digits=True, allow_whitespace_only_pieces=True)
    os.rename(path_prefix + ".model", os.path.join(os.path.dirname(path_prefix), "tokenizer.model"))
    os.remove(path_prefix + ".vocab")


def spm_merges(vocab, scores):
    """Hugging Face's converter's merges for a SentencePiece BPE: every split of every piece into two
    pieces of the vocab, ordered by the merged piece's score (highest first), then by the halves' ids."""
    merges = []
    for piece, score in scores.items():
        local = [(piece[:i], piece[i:], score) for i in range(1, len(piece))
                 if piece[:i] in vocab and piece[i:] in vocab]
        merges.extend(sorted(local, key=lambda x: (vocab[x[0]], vocab[x[1]])))
    merges.sort(key=lambda m: m[2], reverse=True)
    return [[a, b] for a, b, _ in merges]


def make_llama2_like(sp_model, metaspace=None):
    """`sp_model` (a SentencePiece BPE) as Hugging Face's converter writes Llama 2's tokenizer.json (metaspace
    None), as Mistral v0.3's is laid out ("first"), or with Metaspace's other scheme and its decoder ("always")."""
    sp = spm.SentencePieceProcessor(model_file=sp_model)
    vocab, scores = {}, {}
    for i in range(sp.get_piece_size()):
        vocab[sp.id_to_piece(i)] = i
        if not (sp.is_control(i) or sp.is_unknown(i) or sp.is_byte(i)):
            scores[sp.id_to_piece(i)] = sp.get_score(i)
    model = bpe_model(vocab, spm_merges(vocab, scores), unk_token="<unk>", fuse_unk=True, byte_fallback=True)
    specials = [added(sp.unk_id(), "<unk>"), added(sp.bos_id(), "<s>"), added(sp.eos_id(), "</s>")]
    decoder = {"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"String": "▁"}, "content": " "}, {"type": "ByteFallback"},
        {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}
    if metaspace == "first":
        meta = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": False}
        return tokenizer_json(model, specials, pre_tokenizer=meta, post_processor=template("<s>", sp.bos_id()),
                              decoder=decoder)
    if metaspace == "always":
        meta = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": True}
        return tokenizer_json(model, specials, pre_tokenizer=meta, decoder=meta)
    return tokenizer_json(
        model, specials,
        normalizer={"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "▁"}, {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]},
        post_processor=template("<s>", sp.bos_id()), decoder=decoder)


PROBE_TOKENS = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>", "<|endoftext|>", "<|im_start|>", "<s>", "</s>",
                "<unk>", "<mask>", "[NEWTOK]", "ĠZebra", "Hello", "▁the", "<0x0A>", "no such token ¤"]


def bos_eos(tok, data, config):
    """fsdp::tokenizers' BOS and EOS for a tokenizer.json: tokenizer_config.json's bos_token and eos_token,
    else the special tokens that the first template puts before and after the sequence."""
    bos = eos = None
    processors = [data["post_processor"]] if data["post_processor"] else []
    while processors and processors[0]["type"] == "Sequence":
        processors = processors[0]["processors"] + processors[1:]
    templates = [p for p in processors if p["type"] == "TemplateProcessing"]
    if templates and templates[0]["single"]:
        single, specials = templates[0]["single"], templates[0]["special_tokens"]

        def only_id(piece):
            if "SpecialToken" in piece and len(specials[piece["SpecialToken"]["id"]]["ids"]) == 1:
                return specials[piece["SpecialToken"]["id"]]["ids"][0]
            return None
        bos = only_id(single[0])
        eos = only_id(single[-1]) if len(single) > 1 else None
    for key in ("bos_token", "eos_token"):
        if config and key in config:
            value = config[key]
            value = value["content"] if isinstance(value, dict) else value
            token_id = None if value is None else tok.token_to_id(value)
            bos, eos = (token_id, eos) if key == "bos_token" else (bos, token_id)
    return bos, eos


def id_probes(ids):
    """The ids to ask id_to_token about: those of PROBE_TOKENS, and a few of every range."""
    return sorted({i for i in ids if i is not None} | {0, 1, 2, 3, 100, 255, 256, 300, 500, 599, 800, 801, 802, 803,
                                                       1000, 1003, 1004, 1011, 99999})


def hf_reference(name, path, corpus, rng, config):
    tok = Tokenizer.from_file(path)
    cases = []
    for text in corpus:
        ids = tok.encode(text, add_special_tokens=True).ids
        plain = tok.encode(text, add_special_tokens=False).ids
        cases.append({"text": text, "ids": ids, "ids_plain": plain,
                      "decoded": tok.decode(ids, skip_special_tokens=False),
                      "decoded_skip": tok.decode(ids, skip_special_tokens=True)})
    size = tok.get_vocab_size()
    decodes = []
    for _ in range(100):
        ids = [rng.randrange(size) for _ in range(rng.randint(0, 12))]
        decodes.append({"ids": ids, "decoded": tok.decode(ids, skip_special_tokens=False),
                        "decoded_skip": tok.decode(ids, skip_special_tokens=True)})
    with open(path, encoding="utf-8") as f:
        bos, eos = bos_eos(tok, json.load(f), config)
    return {"name": name, "path": path, "vocab_size": size, "bos": bos, "eos": eos,
            "token_ids": {t: tok.token_to_id(t) for t in PROBE_TOKENS},
            "id_tokens": {str(i): tok.id_to_token(i) for i in id_probes(tok.token_to_id(t) for t in PROBE_TOKENS)},
            "cases": cases, "decodes": decodes}


def sp_reference(name, path, corpus, rng):
    sp = spm.SentencePieceProcessor(model_file=path)
    cases = []
    bos = [sp.bos_id()] if sp.bos_id() >= 0 else []
    for text in corpus:
        plain = sp.encode(text)
        ids = bos + plain
        cases.append({"text": text, "ids": ids, "ids_plain": plain, "decoded": sp.decode(ids),
                      "decoded_skip": sp.decode(ids)})
    size = sp.get_piece_size()
    decodes = []
    for _ in range(100):
        ids = [rng.randrange(size) for _ in range(rng.randint(0, 12))]
        decodes.append({"ids": ids, "decoded": sp.decode(ids), "decoded_skip": sp.decode(ids)})
    token_ids = {}
    for t in PROBE_TOKENS:
        i = sp.piece_to_id(t)
        token_ids[t] = None if i == sp.unk_id() and t != sp.id_to_piece(sp.unk_id()) else i
    return {"name": name, "path": path, "vocab_size": size, "bos": sp.bos_id() if sp.bos_id() >= 0 else None,
            "eos": sp.eos_id() if sp.eos_id() >= 0 else None, "token_ids": token_ids,
            "id_tokens": {str(i): sp.id_to_piece(i) for i in id_probes(token_ids.values()) if i < size},
            "cases": cases, "decodes": decodes}


# The character classes of the Llama 3, Qwen2 and GPT-2 patterns, as Oniguruma (in tokenizers) has them.
CHAR_CLASSES = [r"\s", r"\p{L}", r"\p{N}", r"[^\s\p{L}\p{N}]"]


def char_classes(path):
    """For each of CHAR_CLASSES, the code points tokenizers' regex engine matches with it, as [first, last]
    ranges."""
    text = "".join(chr(c) for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF)
    out = {}
    for pattern in CHAR_CLASSES:
        # invert + removed: the matches are kept, everything else dropped.
        pieces = pre_tokenizers.Split(Regex(pattern), "removed", invert=True).pre_tokenize_str(text)
        members = sorted({ord(c) for piece, _ in pieces for c in piece})
        ranges = []
        for c in members:
            if ranges and ranges[-1][1] == c - 1:
                ranges[-1][1] = c
            else:
                ranges.append([c, c])
        out[pattern] = ranges
    with open(path, "w", encoding="utf-8") as f:
        json.dump(out, f)
    print(f"make_tokenizers: {len(out)} character classes in {path}")


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--char-classes":
        return char_classes(sys.argv[2])
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out = sys.argv[1]
    corpus = CORPUS + random_lines(300, seed=1234)
    rng = random.Random(99)
    refs = []

    def save_json(name, data, config=None):
        os.makedirs(os.path.join(out, name), exist_ok=True)
        path = os.path.join(out, name, "tokenizer.json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump(data, f, ensure_ascii=False, indent=2)
        if config is not None:
            with open(os.path.join(out, name, "tokenizer_config.json"), "w", encoding="utf-8") as f:
                json.dump(config, f)
        refs.append(hf_reference(name, path, corpus, rng, config))

    save_json("llama3", make_llama3(), {"bos_token": "<|begin_of_text|>", "eos_token": {"content": "<|eot_id|>"}})
    save_json("gpt2", make_gpt2(add_prefix_space=False))
    save_json("roberta", make_gpt2(add_prefix_space=True))
    save_json("qwen2", make_qwen2(), {"bos_token": None, "eos_token": "<|im_end|>"})
    save_json("splits", make_splits())

    corpus_file = os.path.join(out, "train.txt")
    with open(corpus_file, "w", encoding="utf-8") as f:
        f.write("\n".join(TRAIN * 20 + [c for c in CORPUS if c.strip()]) + "\n")
    for name, kind, size in [("sp_bpe", "bpe", 600), ("sp_unigram", "unigram", 600)]:
        os.makedirs(os.path.join(out, name), exist_ok=True)
        train_sentencepiece(os.path.join(out, name, "sp"), kind, size, corpus_file)
        refs.append(sp_reference(name, os.path.join(out, name, "tokenizer.model"), corpus, rng))

    sp_bpe = os.path.join(out, "sp_bpe", "tokenizer.model")
    save_json("llama2", make_llama2_like(sp_bpe))
    save_json("mistral", make_llama2_like(sp_bpe, metaspace="first"))
    save_json("sp_metaspace", make_llama2_like(sp_bpe, metaspace="always"))

    with open(os.path.join(out, "reference.json"), "w", encoding="utf-8") as f:
        json.dump({"tokenizers": refs}, f, ensure_ascii=False)
    print(f"make_tokenizers: {len(refs)} tokenizers, {len(corpus)} lines each, in {out}")


if __name__ == "__main__":
    main()
