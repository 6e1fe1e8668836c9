"""Call2's probe (run from the repository root with PYTHONPATH=.): one depthwise BF kernel swept
by the pruned search at 8 MiB under cProfile, on an empty database (argv[1])."""
import cProfile, pstats, sys, time
from ucudnn.benchmark import CudnnBenchmarker, ensure_tables
from ucudnn.cache import Cache
from ucudnn.config import Settings
from ucudnn.problem import ConvProblem, ConvKind
from ucudnn.search import named

p = ConvProblem(ConvKind.BACKWARD_FILTER, (32, 672, 14, 14), (672, 1, 5, 5), pads=(2, 2), strides=(1, 1),
                dilations=(1, 1), groups=672, dtype="float16", math="tensor_op", layout="nhwc")
s = Settings.load(workspace_limit="8MiB")
b = CudnnBenchmarker(execution=s.execution, backend=s.backend)
cache = Cache(sys.argv[1])
prof = cProfile.Profile()
t = time.perf_counter()
prof.enable()
tables = ensure_tables([p], s.sizes_for, s.workspace_limit, cache, b, search=named("pruned"))
prof.disable()
print("sweep_s", time.perf_counter() - t, "calls", b.calls)
for m in sorted(tables[p.key], key=lambda m: (m.batch, m.time_ms or 1e9)):
    print(m.batch, m.algo, m.status, m.time_ms, m.workspace)
st = pstats.Stats(prof); st.sort_stats("tottime").print_stats(20); st.sort_stats("cumulative").print_stats(40)
