// Byte sizes and durations as operators write them: "64MiB", "1.5 GB", "250ms", "1h30m".
//
// Daemons take their memory budgets and timeouts in these forms (on the command line and in
// YAML) and print the arithmetic of their configuration with the Format functions, so every
// number an operator reads can be pasted back into a configuration file.
//
// Byte sizes (ParseBytes):
//   <number> [whitespace] [unit]     surrounding whitespace is ignored
//   number: decimal digits, optionally with a fraction ("1.5"); no sign, no exponent, no
//           digit separators. The result must be a whole number of bytes ("1.5 KiB" = 1536 is
//           fine, "0.5 B" is rejected) and fit in uint64_t.
//   unit:   none or B          bytes
//           K, Ki, KiB         2^10       KB   10^3
//           M, Mi, MiB         2^20       MB   10^6
//           G, Gi, GiB         2^30       GB   10^9
//           T, Ti, TiB         2^40       TB   10^12
//   The single letters K/M/G/T are binary (powers of 1024) because that is what a memory size
//   means in this project; only the explicit two-letter forms KB/MB/GB/TB are decimal.
//   Case: the prefix letter and the 'i' may be either case ("64mib" is not accepted, "64MIB"
//   and "64miB" are): the final 'B' must be upper case, because a lower-case 'b' means bits in
//   network rates and a size off by a factor of 8 is worse than an error.
//
// Durations (ParseDuration):
//   one or more <number> [whitespace] <unit> terms, summed: "250ms", "1h30m", "1.5s", "30 s".
//   number: decimal digits with an optional fraction; no sign.
//   unit:   us (also µs), ms, s, m (minutes), h. Units are lower case only ("M" and "MS" are
//           rejected: a month and a megasecond are not durations anyone means here). A unit is
//           required except for a bare "0". The total must be a whole number of microseconds
//           and fit in std::chrono::microseconds.
//
// Every error is InvalidArgument and quotes the text it rejected.
//
// Thread safety: all functions are pure.
#ifndef KVFABRIC_CORE_UNITS_H_
#define KVFABRIC_CORE_UNITS_H_

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

#include "core/statusor.h"

namespace kvfabric {

// Parses a byte size as described above.
StatusOr<std::uint64_t> ParseBytes(std::string_view text);

// Formats `bytes` with the largest binary unit (B, KiB, MiB, GiB, TiB) not larger than it:
//   - an exact multiple of that unit prints as a whole number: "512 B", "64 MiB", "1 GiB";
//   - anything else prints with one decimal, rounded to nearest: "1.5 GiB", "64.0 MiB" for
//     64 MiB + 1 byte. A ".0" therefore means "approximately". This form is for reading: it
//     parses back only when the rounded value happens to be a whole number of bytes.
// Use FormatBytesExact when the reader needs the exact count.
std::string FormatBytes(std::uint64_t bytes);

// FormatBytes(bytes), followed by " (<bytes> bytes)" when that form is not exact, e.g.
// "64.0 MiB (67108865 bytes)" but "64 MiB". For start-up arithmetic lines.
std::string FormatBytesExact(std::uint64_t bytes);

// Parses a duration as described above.
StatusOr<std::chrono::microseconds> ParseDuration(std::string_view text);

// Formats `duration` exactly, in a form ParseDuration reads back to the same value:
//   0 -> "0s"; under one second: "250ms", "1.5ms", "750us"; one second or more: hours, minutes
//   and seconds, zero terms omitted, seconds with a decimal fraction if any: "30s", "5m",
//   "1h30m", "90m" is "1h30m", 3601.5 s is "1h1.5s". Negative durations get a leading "-"
//   (which ParseDuration rejects: no setting in this project takes a negative duration).
std::string FormatDuration(std::chrono::microseconds duration);

}  // namespace kvfabric

#endif  // KVFABRIC_CORE_UNITS_H_
