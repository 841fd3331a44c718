#!/usr/bin/env bash
# Builds the API reference of the public headers (include/fsdp/, recursively)
# with Doxygen, as HTML, into OUTDIR (default build/doc; the pages are
# OUTDIR/html/index.html), from docs/Doxyfile. Any warning - Doxygen's, or
# anything else on its stderr (the filter's errors) - is printed and fails
# the step: the CI check. Needs Debian's doxygen (scripts/deps.sh installs
# it); no graphviz (HAVE_DOT = NO). About a second.
#   scripts/doxygen.sh [OUTDIR]
#
# The headers document with plain // comments; `scripts/doxygen.sh --filter
# FILE` is the Doxyfile's INPUT_FILTER, which hands Doxygen FILE with them
# made Doxygen's (line numbers unchanged):
#   - the banner at the top of a file (// fsdp/x.h — what it is...) becomes
#     the file's documentation, without its "fsdp/x.h — " (the file's name);
#   - a block of // lines directly above a declaration (no blank line, not a
#     #-line, a namespace or an access specifier) becomes ///; others stay;
#   - a trailing // comment after a declaration ending in ; or , (a member, an
#     enumerator) becomes ///<;
#   - nothing changes inside function bodies (inline and template code);
#   - in the converted text, outside `code spans` and "quotes" (which
#     Doxygen takes as they are), \ @ < are escaped (paths like
#     <dir>/rank_<N> are not HTML) and "e.g. " does not end the brief (the
#     first sentence, JAVADOC_AUTOBRIEF); lines indented 3 spaces or more
#     past the text (examples, tables) become a \code{.unparsed} block,
#     unless they are a list item (- or 1.) or its continuation.
set -euo pipefail

if [ "${1:-}" = --filter ]; then
  exec awk '
    function escape(s,   i, c, out) {  # q: the ` or " open, kept across lines
      out = ""
      for (i = 1; i <= length(s); i++) {
        c = substr(s, i, 1)
        if (q == "" && (c == "`" || c == "\"")) q = c
        else if (c == q) q = ""
        else if (q == "" && (c == "\\" || c == "@" || c == "<")) c = "\\" c
        else if (q == "" && (substr(s, i, 5) == "e.g. " || substr(s, i, 5) == "i.e. ")) {
          c = substr(s, i, 4) "\\ "; i += 4
        }
        out = out c
      }
      return out
    }
    function flush(next_line,   i, t, doc, lead, kind) {  # the comment block above next_line
      if (nb == 0) return
      doc = banner || (body == 0 && next_line ~ /[^ \t]/ &&
                       next_line !~ /^[ \t]*(#|}|namespace[ \t]|(public|protected|private)[ \t]*:)/)
      if (!doc) { for (i = 1; i <= nb; i++) print blk[i]; nb = 0; banner = 0; return }
      inlist = 0; q = ""
      for (i = 1; i <= nb; i++) {  # kind: t(ext), l(ist), c(ode)
        t = blk[i]; sub(/^[ \t]*\/\//, "", t)
        if (t ~ /^ +([-*]|[0-9]+\.) /) { kind[i] = "l"; inlist = 1 }
        else if (t ~ /^   /) kind[i] = inlist ? "l" : "c"
        else { kind[i] = "t"; inlist = 0 }
      }
      for (i = 1; i <= nb; i++) {
        lead = blk[i]; sub(/\/\/.*/, "", lead)
        t = blk[i]; sub(/^[ \t]*\/\//, "", t)
        if (kind[i] != "c") t = escape(t)
        if (banner && i == 1) { sub(/^ [^ ]+\.h — /, " ", t); t = t " \\file" }
        if (kind[i] != "c" && kind[i + 1] == "c") t = t " \\code{.unparsed}"
        if (kind[i] == "c" && i == 1) t = " \\code{.unparsed}" t
        if (kind[i] == "c" && kind[i + 1] != "c") t = t " \\endcode"
        print lead "///" t
      }
      nb = 0; banner = 0
    }
    function braces(s,   i, c) {  # kinds of open braces: S(cope) or B(ody)
      gsub(/\\./, "", s); gsub(/"[^"]*"/, "\"\"", s); gsub(/'\''[^'\'']*'\''/, "0", s)
      gsub(/\/\*[^*]*\*\//, " ", s); sub(/\/\/.*/, "", s)
      for (i = 1; i <= length(s); i++) {
        c = substr(s, i, 1)
        if (c == "{") {
          stack[++depth] = (head !~ /\(/ && head ~ /(^|[^A-Za-z0-9_])(namespace|class|struct|union|enum)([^A-Za-z0-9_]|$)/) ? "S" : "B"
          if (stack[depth] == "B") body++
          head = ""
        } else if (c == "}") {
          if (depth > 0 && stack[depth--] == "B") body--
          head = ""
        } else if (c == ";") head = ""
        else head = head c
      }
      head = head " "
    }
    /^[ \t]*\/\/([^\/]|$)/ { if (NR == 1) banner = 1; blk[++nb] = $0; next }
    {
      flush($0)
      if (cont || /^[ \t]*#/) { cont = /\\$/; print; next }  # preprocessor lines
      if (body == 0 && match($0, /[;,][ \t]+\/\/ /)) {
        q = ""; $0 = substr($0, 1, RSTART) " ///<" escape(substr($0, RSTART + RLENGTH - 1))
      }
      braces($0)
      print
    }
    END { flush("") }
  ' "$2"
fi

command -v doxygen >/dev/null || { echo "doxygen: not installed (scripts/deps.sh installs it)" >&2; exit 2; }
out=$(realpath -m "${1:-build/doc}")  # relative to the caller's directory
cd "$(dirname "$0")/.."
rm -rf "$out/html" && mkdir -p "$out"  # html/ only: OUTDIR may hold other things
log=$out/doxygen-warnings.log
# docs/Doxyfile with OUTPUT_DIRECTORY replaced. Its warnings, and anything
# else on stderr (a filter's error, which doxygen ignores), go to $log.
status=0
{ cat docs/Doxyfile; echo "OUTPUT_DIRECTORY = $out"; } | doxygen - 2>"$log" || status=$?
if [ "$status" -ne 0 ] || [ -s "$log" ]; then
  cat "$log" >&2
  echo "doxygen: failed (exit status $status; $(wc -l <"$log") lines on stderr, above)" >&2
  exit 1
fi
echo "doxygen: $out/html/index.html"
