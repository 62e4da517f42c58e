// The HTTP client (see include/sluice/http/client.hpp): its public members,
// and attempts over plain TCP. TLS attempts are client_tls.cpp's.
#include "client_attempt.hpp"

namespace sluice::inline v0::http {

template task<response> client::impl::attempt_on<plain_stream>(plain_stream&, connection&, request&,
                                                               const request_hooks&, std::size_t&, std::string&);

client::client(asio::any_io_executor ex, client_options opt)
    : impl_(std::make_unique<impl>(std::move(ex), std::move(opt))) {}
client::~client() = default;

const client_options& client::options() const noexcept { return impl_->opt; }
asio::any_io_executor client::get_executor() const noexcept { return impl_->ex; }
const io_counters& client::counters() const noexcept { return impl_->counters; }
io_counters& client::counters() noexcept { return impl_->counters; }
std::size_t client::idle_connections() const { return impl_->pool.idle(); }
std::size_t client::busy_connections() const { return impl_->pool.in_use(); }
void client::cancel() { impl_->cancel(); }
bool client::cancelled() const noexcept { return impl_->cancelled; }
task<result> client::execute(request r, const request_hooks& hooks) { return impl_->execute(std::move(r), hooks); }

}  // namespace sluice::inline v0::http
