// The rendezvous store of a distributed load from Python: a torch.distributed
// store as comm::kv_store (comm/store.hpp), which comm::gloo and the NCCL id
// exchange accept through rank_info::kv. Its calls come from the load's
// threads, so each takes the GIL.
#include "bindings.hpp"

#include <pybind11/stl.h>

namespace sluice_py {

namespace {

struct torch_kv final : comm::kv_store {
  py::object store;
  explicit torch_kv(py::object s) : store(std::move(s)) {}
  ~torch_kv() override {
    py::gil_scoped_acquire gil;
    store = py::object();
  }
  void set(const std::string& key, const std::vector<char>& value) override {
    py::gil_scoped_acquire gil;
    store.attr("set")(key, py::bytes(value.data(), value.size()));
  }
  std::vector<char> get(const std::string& key, std::chrono::milliseconds timeout) override {
    wait({key}, timeout);
    py::gil_scoped_acquire gil;
    const std::string v = store.attr("get")(key).cast<py::bytes>();
    return {v.begin(), v.end()};
  }
  void erase(const std::string& key) override {
    py::gil_scoped_acquire gil;
    try {
      store.attr("delete_key")(key);
    } catch (py::error_already_set&) {  // a store without delete_key keeps the key
    }
  }
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    py::gil_scoped_acquire gil;
    try {
      // Leaked on purpose: a static py::object would be released after the interpreter is gone.
      static auto* timedelta = new py::object(py::module_::import("datetime").attr("timedelta"));
      store.attr("wait")(keys, (*timedelta)(py::arg("milliseconds") = timeout.count()));
    } catch (py::error_already_set& e) {
      throw comm::comm_error(fmt::format("store: waiting for '{}' failed: {}", keys.empty() ? "" : keys.front(), e.what()));
    }
  }
};

}  // namespace

std::shared_ptr<comm::kv_store> torch_store(py::object store) {
  if (store.is_none()) return nullptr;
  return std::make_shared<torch_kv>(std::move(store));
}

}  // namespace sluice_py
