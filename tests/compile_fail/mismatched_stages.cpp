// coalesce produces read requests; place consumes tensor views: `|` must refuse.
#include <sluice/sink/discard_sink.hpp>
#include <sluice/stages/coalesce.hpp>
#include <sluice/stages/pipeline.hpp>
#include <sluice/stages/place.hpp>

int main() {
  sluice::discard_sink s;
  auto p = sluice::coalesce{} | sluice::place<sluice::discard_sink>{s};
  (void)p;
}
