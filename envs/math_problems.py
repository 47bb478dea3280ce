"""The math env's own problems: generated with exact answers (arithmetic, fractions, modular
powers, divisor counts, root sets, intervals, surds), the same for the same seed, each with the
Python that computes its answer (the SFT demonstrations and the tests use it). `builtin` in
taskdata/math.py is these.
"""

from __future__ import annotations

import math
import random
from fractions import Fraction
from typing import Iterable

from envs.base import Task

BUILTIN_N = 60  # problems in the math loader's `builtin` (a seed of its own: builtin:SEED)


def _frac(q: Fraction) -> str:
    """LaTeX of a rational: an integer, or a reduced \\frac with the sign in front."""
    if q.denominator == 1:
        return str(q.numerator)
    return ("-" if q < 0 else "") + f"\\frac{{{abs(q.numerator)}}}{{{q.denominator}}}"


def _arith(rng):
    a, b, c = rng.randint(12, 99), rng.randint(12, 99), rng.randint(1, 999)
    return f"Compute ${a} \\times {b} - {c}$.", str(a * b - c), f"print({a} * {b} - {c})"


def _power_mod(rng):
    a, n, m = rng.randint(2, 19), rng.randint(50, 999), rng.randint(7, 97)
    return (f"What is the remainder when ${a}^{{{n}}}$ is divided by ${m}$?", str(pow(a, n, m)),
            f"print(pow({a}, {n}, {m}))")


def _fraction(rng):
    a, b, c, d = rng.randint(1, 9), rng.randint(2, 12), rng.randint(1, 9), rng.randint(2, 12)
    q = Fraction(a, b) + Fraction(c, d)
    return (f"Compute $\\frac{{{a}}}{{{b}}} + \\frac{{{c}}}{{{d}}}$ as a fraction in lowest terms.", _frac(q),
            f"from fractions import Fraction\nprint(Fraction({a}, {b}) + Fraction({c}, {d}))")


def _divisors(rng):
    n = rng.randint(100, 5000)
    count = sum(1 for d in range(1, n + 1) if n % d == 0)
    return (f"How many positive divisors does ${n}$ have?", str(count),
            f"print(sum(1 for d in range(1, {n} + 1) if {n} % d == 0))")


def _multiples(rng):
    n, (a, b) = rng.randint(50, 2000), rng.sample(range(2, 10), 2)
    total = sum(k for k in range(1, n) if k % a == 0 or k % b == 0)
    return (f"What is the sum of all positive integers less than ${n}$ that are divisible by ${a}$ or ${b}$?",
            str(total), f"print(sum(k for k in range(1, {n}) if k % {a} == 0 or k % {b} == 0))")


def _roots(rng):
    r, s = rng.sample(range(-9, 10), 2)
    b, c = -(r + s), r * s
    linear = f"{abs(b)}x" if abs(b) != 1 else "x"
    poly = "x^2" + (f" {'+' if b > 0 else '-'} {linear}" if b else "") \
        + (f" {'+' if c > 0 else '-'} {abs(c)}" if c else "")
    lo, hi = sorted((r, s))
    return (f"Find the set of all real numbers $x$ with ${poly} = 0$.", f"\\{{{lo}, {hi}\\}}",
            f"print({{x for x in range(-20, 21) if x * x + ({b}) * x + ({c}) == 0}})")


def _interval(rng):
    a, b, c = rng.randint(2, 9), rng.randint(-20, 20), rng.randint(-20, 20)
    t = Fraction(c - b, a)
    sign = "+" if b >= 0 else "-"
    return (f"Solve ${a}x {sign} {abs(b)} > {c}$ over the real numbers. Give the answer as an interval.",
            f"\\left({_frac(t)}, \\infty\\right)",
            f"from fractions import Fraction\nprint(f'({{Fraction({c} - ({b}), {a})}}, \\\\infty)')")


def _surd(rng):
    k, m = rng.randint(2, 9), rng.choice([2, 3, 5, 6, 7, 10, 11, 13])
    n = k * k * m
    return (f"Simplify $\\sqrt{{{n}}}$ to the form $a\\sqrt{{b}}$ with $b$ square-free.", f"{k}\\sqrt{{{m}}}",
            f"n = {n}\nk = max(d for d in range(1, n + 1) if n % (d * d) == 0)\nprint(f'{{k}}*sqrt({{n // (k * k)}})')")


def _gcd(rng):
    g = rng.randint(2, 40)
    a, b = g * rng.randint(2, 60), g * rng.randint(2, 60)
    return f"What is the greatest common divisor of ${a}$ and ${b}$?", str(math.gcd(a, b)), \
        f"import math\nprint(math.gcd({a}, {b}))"


KINDS = {"arith": _arith, "power_mod": _power_mod, "fraction": _fraction, "divisors": _divisors,
         "multiples": _multiples, "roots": _roots, "interval": _interval, "surd": _surd, "gcd": _gcd}


def make_math_tasks(n: int = BUILTIN_N, seed: int = 0, kinds: Iterable[str] | None = None) -> list[Task]:
    """`n` generated problems, the kinds taken in turn; the exact answer (LaTeX) is in
    `extra["answer"]`, Python that prints it in `extra["code"]`."""
    kinds = list(kinds or KINDS)
    unknown = [k for k in kinds if k not in KINDS]
    if unknown or not kinds:
        raise ValueError(f"math kinds {unknown or kinds}: not known (known: {', '.join(KINDS)})")
    rng = random.Random(seed)
    tasks = []
    for i in range(n):
        kind = kinds[i % len(kinds)]
        problem, answer, code = KINDS[kind](rng)
        tasks.append(Task(instance_id=f"math-{seed}-{i}", repo="builtin", base_commit="-", problem_statement=problem,
                          extra={"answer": answer, "kind": kind, "code": code}))
    return tasks
