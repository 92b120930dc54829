#include "core/units.h"

#include <array>
#include <cstdio>
#include <limits>
#include <string>

namespace kvfabric {

namespace {

// Intermediate arithmetic is done in 128 bits so that "mantissa × unit" cannot wrap before the
// range check: a mantissa is capped at kMaxMantissa = 1e24 and a unit at 2^40 (bytes) or 3.6e9
// (microseconds per hour), so a product stays below 4e33 < 2^128.
using U128 = unsigned __int128;

constexpr U128 kMaxMantissa = static_cast<U128>(1000000000000ULL) * 1000000000000ULL;

bool IsSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}
bool IsDigit(char c) { return c >= '0' && c <= '9'; }

std::string_view Trim(std::string_view s) {
  while (!s.empty() && IsSpace(s.front())) s.remove_prefix(1);
  while (!s.empty() && IsSpace(s.back())) s.remove_suffix(1);
  return s;
}

// `text` in double quotes, with control and non-ASCII bytes escaped so that an error message
// stays on one line whatever the operator typed.
std::string Quote(std::string_view text) {
  std::string out = "\"";
  for (unsigned char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  out += '"';
  return out;
}

std::string U128ToString(U128 v) {
  if (v == 0) return "0";
  std::string digits;
  while (v != 0) {
    digits.insert(digits.begin(), static_cast<char>('0' + static_cast<int>(v % 10)));
    v /= 10;
  }
  return digits;
}

U128 Pow10(int n) {
  U128 p = 1;
  for (int i = 0; i < n; ++i) p *= 10;
  return p;
}

// A decimal number "123" or "1.25" as mantissa / 10^fraction_digits.
struct Decimal {
  U128 mantissa = 0;
  int fraction_digits = 0;
};

// Consumes a decimal number from the front of `*s`. Returns an empty string on success, else
// what is wrong with it.
std::string ConsumeDecimal(std::string_view* s, Decimal* out) {
  Decimal d;
  size_t i = 0;
  size_t int_digits = 0;
  for (; i < s->size() && IsDigit((*s)[i]); ++i, ++int_digits) {
    d.mantissa = d.mantissa * 10 + static_cast<unsigned>((*s)[i] - '0');
    if (d.mantissa > kMaxMantissa) return "too many digits";
  }
  size_t frac_digits = 0;
  if (i < s->size() && (*s)[i] == '.') {
    ++i;
    for (; i < s->size() && IsDigit((*s)[i]); ++i, ++frac_digits) {
      d.mantissa = d.mantissa * 10 + static_cast<unsigned>((*s)[i] - '0');
      if (d.mantissa > kMaxMantissa) return "too many digits";
      ++d.fraction_digits;
    }
    if (frac_digits == 0) return "a decimal point must be followed by digits";
  }
  if (int_digits == 0) return "expected a number";
  // "1.50" means the same as "1.5": drop trailing fraction zeros so fewer digits need dividing.
  while (d.fraction_digits > 0 && d.mantissa % 10 == 0) {
    d.mantissa /= 10;
    --d.fraction_digits;
  }
  s->remove_prefix(i);
  *out = d;
  return "";
}

// mantissa × unit / 10^fraction_digits, if that is a whole number; false otherwise.
bool ScaleExactly(const Decimal& d, U128 unit, U128* out) {
  const U128 scaled = d.mantissa * unit;  // < 1e24 * 3.6e9: no wrap in 128 bits.
  const U128 divisor = Pow10(d.fraction_digits);
  if (scaled % divisor != 0) return false;
  *out = scaled / divisor;
  return true;
}

constexpr std::string_view kByteUnitsHelp =
    "expected no unit or B; K, Ki, KiB, M, Mi, MiB, G, Gi, GiB, T, Ti, TiB for powers of 1024; "
    "KB, MB, GB, TB for powers of 1000";

// The multiplier for a byte unit, or 0 if `unit` is not one.
std::uint64_t ByteUnitMultiplier(std::string_view unit) {
  if (unit.empty() || unit == "B") return 1;
  int exponent = 0;
  switch (unit.front()) {
    case 'k':
    case 'K':
      exponent = 1;
      break;
    case 'm':
    case 'M':
      exponent = 2;
      break;
    case 'g':
    case 'G':
      exponent = 3;
      break;
    case 't':
    case 'T':
      exponent = 4;
      break;
    default:
      return 0;
  }
  const std::string_view rest = unit.substr(1);
  std::uint64_t base = 0;
  if (rest.empty() || rest == "i" || rest == "I" || rest == "iB" || rest == "IB") {
    base = 1024;
  } else if (rest == "B") {
    base = 1000;
  } else {
    return 0;
  }
  std::uint64_t m = 1;
  for (int i = 0; i < exponent; ++i) m *= base;
  return m;
}

struct DurationUnit {
  std::string_view name;
  std::int64_t micros;
};

// "µs" is spelled with MICRO SIGN (U+00B5) and GREEK SMALL LETTER MU (U+03BC); both are typed.
constexpr std::array<DurationUnit, 7> kDurationUnits = {{
    {"us", 1},
    {"\xc2\xb5s", 1},
    {"\xce\xbcs", 1},
    {"ms", 1000},
    {"s", 1000000},
    {"m", 60LL * 1000000},
    {"h", 3600LL * 1000000},
}};

constexpr std::string_view kDurationUnitsHelp = "expected us, ms, s, m or h (lower case)";

bool IsUnitByte(char c) {
  const auto u = static_cast<unsigned char>(c);
  return (u >= 'a' && u <= 'z') || (u >= 'A' && u <= 'Z') || u >= 0x80;
}

Status BadBytes(std::string_view text, std::string_view why) {
  return Status::InvalidArgument("invalid byte size " + Quote(text) + ": " + std::string(why));
}

Status BadDuration(std::string_view text, std::string_view why) {
  return Status::InvalidArgument("invalid duration " + Quote(text) + ": " + std::string(why));
}

// Appends "." and the decimal digits of `fraction` / `scale`, trailing zeros dropped.
// REQUIRES: 0 < fraction < scale, scale a power of ten.
void AppendFraction(std::uint64_t fraction, std::uint64_t scale, std::string* out) {
  std::string digits;
  for (std::uint64_t s = scale / 10; s > 0; s /= 10) {
    digits += static_cast<char>('0' + (fraction / s) % 10);
  }
  while (!digits.empty() && digits.back() == '0') digits.pop_back();
  *out += '.';
  *out += digits;
}

}  // namespace

StatusOr<std::uint64_t> ParseBytes(std::string_view text) {
  std::string_view s = Trim(text);
  if (s.empty()) return BadBytes(text, "empty");
  if (s.front() == '-') return BadBytes(text, "sizes cannot be negative");
  Decimal d;
  if (std::string why = ConsumeDecimal(&s, &d); !why.empty()) return BadBytes(text, why);
  const std::string_view unit = Trim(s);
  const std::uint64_t multiplier = ByteUnitMultiplier(unit);
  if (multiplier == 0) {
    std::string why = "unknown unit " + Quote(unit) + " (" + std::string(kByteUnitsHelp);
    if (!unit.empty() && unit.back() == 'b')
      why += "; a lower-case 'b' means bits and is not accepted";
    return BadBytes(text, why + ")");
  }
  U128 bytes = 0;
  if (!ScaleExactly(d, multiplier, &bytes)) return BadBytes(text, "not a whole number of bytes");
  if (bytes > std::numeric_limits<std::uint64_t>::max()) {
    return BadBytes(text, "out of range (the largest size is " +
                              std::to_string(std::numeric_limits<std::uint64_t>::max()) +
                              " bytes, 16 EiB)");
  }
  return static_cast<std::uint64_t>(bytes);
}

std::string FormatBytes(std::uint64_t bytes) {
  static constexpr std::array<std::string_view, 5> kNames = {"B", "KiB", "MiB", "GiB", "TiB"};
  size_t index = 0;
  while (index + 1 < kNames.size() && bytes >= (std::uint64_t{1} << (10 * (index + 1)))) ++index;
  std::uint64_t unit = std::uint64_t{1} << (10 * index);
  if (bytes % unit == 0) return std::to_string(bytes / unit) + " " + std::string(kNames[index]);
  // Tenths of the unit, rounded to nearest; 1023.96 MiB rounds to 1024.0 and is promoted to
  // 1.0 GiB so that the number shown is always below 1024 (except in TiB, the last unit).
  U128 tenths = (static_cast<U128>(bytes) * 10 + unit / 2) / unit;
  if (tenths >= 10240 && index + 1 < kNames.size()) {
    ++index;
    unit <<= 10;
    tenths = (static_cast<U128>(bytes) * 10 + unit / 2) / unit;
  }
  return U128ToString(tenths / 10) + "." + U128ToString(tenths % 10) + " " +
         std::string(kNames[index]);
}

std::string FormatBytesExact(std::uint64_t bytes) {
  std::string s = FormatBytes(bytes);
  if (s.find('.') != std::string::npos) s += " (" + std::to_string(bytes) + " bytes)";
  return s;
}

StatusOr<std::chrono::microseconds> ParseDuration(std::string_view text) {
  std::string_view s = Trim(text);
  if (s.empty()) return BadDuration(text, "empty");
  if (s.front() == '-') return BadDuration(text, "durations cannot be negative");
  if (s == "0") return std::chrono::microseconds(0);
  U128 total = 0;
  while (!s.empty()) {
    Decimal d;
    if (std::string why = ConsumeDecimal(&s, &d); !why.empty()) return BadDuration(text, why);
    s = Trim(s);
    size_t unit_len = 0;
    while (unit_len < s.size() && IsUnitByte(s[unit_len])) ++unit_len;
    const std::string_view unit = s.substr(0, unit_len);
    if (unit.empty()) {
      return BadDuration(text, "a number needs a unit (" + std::string(kDurationUnitsHelp) + ")");
    }
    std::int64_t micros = 0;
    for (const DurationUnit& u : kDurationUnits) {
      if (u.name == unit) micros = u.micros;
    }
    if (micros == 0) {
      return BadDuration(
          text, "unknown unit " + Quote(unit) + " (" + std::string(kDurationUnitsHelp) + ")");
    }
    U128 term = 0;
    if (!ScaleExactly(d, static_cast<U128>(micros), &term)) {
      return BadDuration(text, "not a whole number of microseconds");
    }
    total += term;  // total <= 2^63 before, term < 4e33: no wrap.
    if (total > static_cast<U128>(std::numeric_limits<std::int64_t>::max())) {
      return BadDuration(text, "out of range (the longest duration is about 292,000 years)");
    }
    s = Trim(s.substr(unit_len));
  }
  return std::chrono::microseconds(static_cast<std::int64_t>(total));
}

std::string FormatDuration(std::chrono::microseconds duration) {
  const std::int64_t count = duration.count();
  if (count == 0) return "0s";
  std::string out;
  // Magnitude in unsigned arithmetic: -INT64_MIN does not fit in int64_t.
  std::uint64_t us = static_cast<std::uint64_t>(count);
  if (count < 0) {
    out = "-";
    us = 0 - us;
  }
  constexpr std::uint64_t kMs = 1000, kSec = 1000000, kMin = 60 * kSec, kHour = 60 * kMin;
  if (us < kSec) {
    if (us < kMs) return out + std::to_string(us) + "us";
    out += std::to_string(us / kMs);
    if (us % kMs != 0) AppendFraction(us % kMs, kMs, &out);
    return out + "ms";
  }
  const std::uint64_t hours = us / kHour;
  const std::uint64_t minutes = (us % kHour) / kMin;
  const std::uint64_t seconds = (us % kMin) / kSec;
  const std::uint64_t fraction = us % kSec;
  if (hours != 0) out += std::to_string(hours) + "h";
  if (minutes != 0) out += std::to_string(minutes) + "m";
  if (seconds != 0 || fraction != 0) {
    out += std::to_string(seconds);
    if (fraction != 0) AppendFraction(fraction, kSec, &out);
    out += "s";
  }
  return out;
}

}  // namespace kvfabric
