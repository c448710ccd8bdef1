#include <catch2/catch.hpp>

#include "tier/types.hpp"
#include "base/sizes.hpp"
#include "base/names.hpp"

using namespace tier;

TEST_CASE("parse_size accepts the documented forms") {
  CHECK(parse_size("4096").value() == 4096);
  CHECK(parse_size("512K").value() == 512ull << 10);
  CHECK(parse_size("512M").value() == 512ull << 20);
  CHECK(parse_size("64G").value() == 64ull << 30);
  CHECK(parse_size("64GiB").value() == 64ull << 30);
  CHECK(parse_size("1.5T").value() == (3ull << 40) / 2);
  CHECK(parse_size("80%", 1000).value() == 800);
  CHECK(parse_size(" 2g ").value() == 2ull << 30);
}

TEST_CASE("parse_size rejects everything else with a message naming the text") {
  for (const char* s : {"", "abc", "12X", "-5", "1.5", "80%", "101%", "nan", "1e30T", "5MM"}) {
    auto r =
        s == std::string("80%") || s == std::string("101%") ? parse_size(s, std::nullopt) : parse_size(s);
    INFO(s);
    REQUIRE_FALSE(r.has_value());
    CHECK(r.error().code() == Code::kInvalidArgument);
    CHECK(r.error().message().find(s) != std::string::npos);
  }
  CHECK_FALSE(parse_size("101%", 100).has_value());
}

TEST_CASE("format_size is human readable") {
  CHECK(format_size(12) == "12 B");
  CHECK(format_size(1536) == "1.50 KiB");
  CHECK(format_size(512ull << 20) == "512 MiB");
  CHECK(format_size(3ull << 39) == "1.50 TiB");
}

TEST_CASE("names are validated") {
  CHECK(validate_pool_name("job-1.a_b").is_ok());
  CHECK_FALSE(validate_pool_name("").is_ok());
  CHECK_FALSE(validate_pool_name("a/b").is_ok());
  CHECK_FALSE(validate_pool_name("..").is_ok());
  CHECK_FALSE(validate_pool_name(std::string(256, 'a')).is_ok());
  CHECK(validate_tensor_name("layer.0/w").code() == Code::kInvalidArgument);
  CHECK(validate_tensor_name("layer.0:w q").is_ok());
}

TEST_CASE("tensor names are printable UTF-8") {
  using namespace std::string_literals;
  CHECK(first_unprintable("plain ascii ~!") == std::string_view::npos);
  CHECK(first_unprintable("\xc3\xbc \xe5\x90\x8d \xf0\x9f\x98\x80 \xc2\xa0 \xf4\x8f\xbf\xbf") ==
        std::string_view::npos);
  CHECK(first_unprintable("ab\ncd") == 2);
  CHECK(first_unprintable("\x1b[0m") == 0);
  CHECK(first_unprintable("x\x7f") == 1);              // DEL
  CHECK(first_unprintable("x\xc2\x80") == 1);          // C1: U+0080
  CHECK(first_unprintable("x\xc2\x9f") == 1);          // C1: U+009F
  CHECK(first_unprintable("x\x80") == 1);              // stray continuation byte
  CHECK(first_unprintable("x\xc0\xaf") == 1);          // overlong '/'
  CHECK(first_unprintable("x\xe0\x80\xaf") == 1);      // overlong, 3 bytes
  CHECK(first_unprintable("x\xed\xa0\x80") == 1);      // surrogate U+D800
  CHECK(first_unprintable("x\xf4\x90\x80\x80") == 1);  // above U+10FFFF
  CHECK(first_unprintable("x\xe6\x97") == 1);          // truncated
  CHECK(first_unprintable("x\xff") == 1);
  CHECK(first_unprintable("a\0b"s) == 1);
  Status st = validate_tensor_name("a\tb");
  CHECK(st.code() == Code::kInvalidArgument);
  CHECK(st.message().find("offset 1") != std::string::npos);
  CHECK(validate_tensor_name("w\xc3\xbc").is_ok());
  // What an older catalog may hold still passes the structural check.
  CHECK(validate_stored_tensor_name("a\nb").is_ok());
  CHECK_FALSE(validate_stored_tensor_name("a/b").is_ok());
}

TEST_CASE("errno becomes a status in one place") {
  auto s = Status::from_errno(ENOENT, "open /x");
  CHECK(s.code() == Code::kNotFound);
  CHECK(s.message().rfind("open /x: ", 0) == 0);
  CHECK(Status::from_errno(ENOSPC, "w").code() == Code::kResourceExhausted);
  CHECK(Status::from_errno(EACCES, "w").code() == Code::kPermissionDenied);
}

TEST_CASE("dtype names round-trip") {
  for (uint8_t d = 0; d <= kMaxDType; ++d) {
    auto dt = static_cast<DType>(d);
    CHECK(dtype_from_name(dtype_name(dt)) == dt);
  }
  CHECK(dtype_size(DType::kBF16) == 2);
  CHECK_FALSE(dtype_from_name("f128").has_value());
}
