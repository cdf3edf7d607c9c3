// Text that crosses a process boundary (abort reasons in a segment or a TCP
// ABORT frame, a peer's junk) and ends in a Python exception message, which
// must be valid UTF-8: cut at a character boundary, and make readable.
#pragma once

#include <cstddef>
#include <string>

namespace ringcomm {

// The longest prefix of s of at most max_bytes that does not split a UTF-8
// character (continuation bytes are 10xxxxxx).
inline size_t utf8_cut(const std::string& s, size_t max_bytes) {
  if (s.size() <= max_bytes) return s.size();
  size_t n = max_bytes;
  while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;
  return n;
}

// s with every byte that is not part of a well-formed UTF-8 character
// replaced by '?', and (controls_too: text a peer sent) every control
// character but tab as well.
inline std::string readable_text(const std::string& s, bool controls_too = true) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    size_t len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    bool ok = len > 0 && i + len <= s.size();
    for (size_t k = 1; ok && k < len; ++k) ok = (static_cast<unsigned char>(s[i + k]) & 0xC0) == 0x80;
    if (ok && len > 1) {
      // Overlong forms, surrogates and code points past U+10FFFF are not UTF-8.
      unsigned cp = c & (0x7F >> len);
      for (size_t k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
      const unsigned min_cp[] = {0, 0, 0x80, 0x800, 0x10000};
      ok = cp >= min_cp[len] && cp <= 0x10FFFF && !(cp >= 0xD800 && cp <= 0xDFFF);
    }
    if (!ok) {
      out += '?';
      ++i;
      continue;
    }
    if (controls_too && len == 1 && ((c < 0x20 && c != '\t') || c == 0x7F)) {
      out += '?';
    } else {
      out.append(s, i, len);
    }
    i += len;
  }
  return out;
}

}  // namespace ringcomm
