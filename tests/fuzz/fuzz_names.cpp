// libFuzzer target: checkpoint names through the placement rules. The input
// is a name (any bytes, any length): the DeepSeek classifier's rules
// (class, expert index, layer, pipeline anchor, TP split), the contract's
// default layer pattern and printing it. Then the input as a user pattern (RE2) searched in
// a fixed name. Only config_error may come out; nothing may recurse per byte.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include <sluice/error.hpp>
#include <sluice/format/name_pattern.hpp>
#include <sluice/policy/classify.hpp>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace sluice;
  static const policy::classifier deepseek = policy::classifier::deepseek();
  static const format::name_pattern layers(R"(layers\.(\d+)\.)");   // manifest::default_layer_pattern
  const std::string name(reinterpret_cast<const char*>(data), size);
  policy::tensor_info t{name, 64, {8, 8}};
  try {
    deepseek.classify(t);
    if (t.cls == policy::tensor_class::routed_expert && (t.expert < 0 || t.expert >= (std::int64_t{1} << 32))) std::abort();
    deepseek.layer(t);
    (void)deepseek.anchor(t);
    (void)deepseek.split(t, 2);
  } catch (const config_error&) {
  }
  (void)layers.group(name);
  const auto shown = printable(name, 256);
  if (shown.find('\n') != std::string::npos || shown.find('\t') != std::string::npos) std::abort();
  try {
    const format::name_pattern p(name);
    (void)p.search("model.layers.3.mlp.experts.7.w1.weight");
    (void)p.group("model.layers.3.mlp.experts.7.w1.weight");
  } catch (const config_error&) {
  }
  return 0;
}
