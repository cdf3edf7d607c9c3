// ringcomm/text.h: abort reasons cut at a character boundary, and a peer's
// bytes (junk included) made into valid UTF-8 text.
#include <string>

#include "check.h"
#include "ringcomm/text.h"
#include "transport/tcp/wire.h"

using namespace ringcomm;

namespace {

const std::string kEuro = "\xE2\x82\xAC";  // U+20AC, three bytes

}  // namespace

NATIVE_TEST(text, a_cut_never_splits_a_character) {
  std::string s = "x";
  for (int i = 0; i < 400; ++i) s += kEuro;
  for (size_t max : {0u, 1u, 2u, 3u, 4u, 511u, 1024u}) {
    const size_t n = utf8_cut(s, max);
    CHECK(n <= max);
    CHECK(max < 1 || n + 2 >= max);  // at most the two bytes of a cut character dropped
    CHECK_EQ(readable_text(s.substr(0, n)), s.substr(0, n));
  }
  CHECK_EQ(utf8_cut("abc", 10), size_t(3));
}

NATIVE_TEST(text, junk_becomes_question_marks) {
  CHECK_EQ(readable_text("ok \xC3\xA9 " + kEuro), "ok \xC3\xA9 " + kEuro);  // valid text stays
  CHECK_EQ(readable_text(std::string("a\xFF" "b")), "a?b");                 // never a UTF-8 byte
  CHECK_EQ(readable_text(std::string("a\xE2\x82")), "a??");                 // cut character at the end
  CHECK_EQ(readable_text(std::string("\xC0\xAF")), "??");                   // overlong '/'
  CHECK_EQ(readable_text(std::string("\xED\xA0\x80")), "???");              // a surrogate
  CHECK_EQ(readable_text(std::string("\xF4\x90\x80\x80")), "????");         // past U+10FFFF
  CHECK_EQ(readable_text(std::string("a\nb\x1B" "c\td")), "a?b?c\td");      // controls from a peer
  CHECK_EQ(readable_text(std::string("a\nb"), false), "a\nb");              // ... kept in our own messages
  std::string all;
  for (int c = 0; c < 256; ++c) all += static_cast<char>(c);
  const std::string out = readable_text(all);
  CHECK_EQ(readable_text(out), out);  // the output is valid text
}

NATIVE_TEST(text, an_abort_frame_keeps_whole_characters) {
  std::string why;
  for (int i = 0; i < 400; ++i) why += kEuro;
  const std::string frame = tcp::control_frame(tcp::kAbort, why);
  const std::string reason = frame.substr(sizeof(tcp::FrameHeader));
  CHECK(reason.size() <= 1024);
  CHECK_EQ(reason.size() % 3, size_t(0));
  CHECK_EQ(readable_text(reason), reason);
}
