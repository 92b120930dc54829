// libFuzzer target: the calibration file loader (core/bus_calibration.h), which placement and
// daemons read at start and on SIGHUP. Any bytes must load or be refused with a Status naming
// the field; what loads must survive a save and load unchanged.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "core/bus_calibration.h"

using namespace kvfabric;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  auto c = BusCalibrationFromJson(std::string(reinterpret_cast<const char*>(data), size));
  if (!c.ok()) return 0;
  const std::string saved = BusCalibrationToJson(*c);
  auto again = BusCalibrationFromJson(saved);
  if (!again.ok() || BusCalibrationToJson(*again) != saved) std::abort();
  return 0;
}
