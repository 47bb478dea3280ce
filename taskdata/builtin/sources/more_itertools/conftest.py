"""Added for the SAO built-in task suite (not upstream): deselect slow and timing- or
thread-dependent tests, so the whole suite runs in a few seconds and never flakes under load."""

_SLOW_OR_TIMING = (
    "tests/test_more.py::TimeLimitedTests::",
    "tests/test_more.py::CallbackIterTests::",
    "tests/test_more.py::TestSerialize::",
    "tests/test_more.py::TestSynchronized::",
    "tests/test_more.py::TestConcurrentTee::",
    "tests/test_more.py::DiscreteFourierTransformTests::test_roundtrip",
    "tests/test_more.py::TestRandomOrderedRange::test_lcg_mitigation",
    "tests/test_recipes.py::PrimeFunctionTests::test_primes",
    "tests/test_recipes.py::PrimeFunctionTests::test_nth_prime_approximate",
    "tests/test_recipes.py::PolynomialFromRootsTests::test_large",
    "tests/test_recipes.py::RunningMedianTests::test_vs_statistics_median",
)


def pytest_collection_modifyitems(config, items):
    keep, drop = [], []
    for item in items:
        (drop if item.nodeid.startswith(_SLOW_OR_TIMING) else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
