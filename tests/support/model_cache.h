#pragma once
// One loaded model per (fixture family, device) for the whole test binary:
// loading a fixture costs more than most tests that use it.
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "kvgraph/model.h"
#include "support/fixtures.h"

namespace kvgraph::testing {

inline std::shared_ptr<const Model> shared_fixture(const std::string& family, Device device = Device::CPU) {
  static std::mutex mu;
  static std::map<std::pair<std::string, Device>, std::shared_ptr<const Model>> models;
  std::lock_guard lk(mu);
  auto& m = models[{family, device}];
  if (!m) m = Model::load(fixtures_dir() / family, device);
  return m;
}

}  // namespace kvgraph::testing
