#include "core/config/unit_flags.h"

#include <string>

#include "core/units.h"

namespace kvfabric {

CLI::Option* AddBytesOption(CLI::App& app, const std::string& name, std::uint64_t* bytes,
                            const std::string& description) {
  // The check runs before the callback (CLI::Option::run_callback validates, then calls back),
  // so the callback only ever sees text that parses.
  CLI::Validator check(
      [](std::string& text) -> std::string {
        StatusOr<std::uint64_t> parsed = ParseBytes(text);
        return parsed.ok() ? std::string() : std::string(parsed.status().message());
      },
      "", "BYTES");
  return app
      .add_option_function<std::string>(
          name,
          [bytes](const std::string& text) {
            StatusOr<std::uint64_t> parsed = ParseBytes(text);
            if (parsed.ok()) *bytes = *parsed;
          },
          description)
      ->check(check)
      ->type_name("BYTES")
      ->default_str(FormatBytes(*bytes));
}

CLI::Option* AddDurationOption(CLI::App& app, const std::string& name,
                               std::chrono::microseconds* duration,
                               const std::string& description) {
  CLI::Validator check(
      [](std::string& text) -> std::string {
        StatusOr<std::chrono::microseconds> parsed = ParseDuration(text);
        return parsed.ok() ? std::string() : std::string(parsed.status().message());
      },
      "", "DURATION");
  return app
      .add_option_function<std::string>(
          name,
          [duration](const std::string& text) {
            StatusOr<std::chrono::microseconds> parsed = ParseDuration(text);
            if (parsed.ok()) *duration = *parsed;
          },
          description)
      ->check(check)
      ->type_name("DURATION")
      ->default_str(FormatDuration(*duration));
}

}  // namespace kvfabric
