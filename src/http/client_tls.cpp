// The HTTP client's attempts over TLS (see client_attempt.hpp): a unit of
// their own, so that Beast's HTTP path is compiled once per stream type per
// unit.
#include "client_attempt.hpp"

namespace sluice::inline v0::http {

template task<response> client::impl::attempt_on<tls_stream>(tls_stream&, connection&, request&, const request_hooks&,
                                                             std::size_t&, std::string&);

}  // namespace sluice::inline v0::http
