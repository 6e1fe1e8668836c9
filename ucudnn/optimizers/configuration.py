"""A configuration: the micro-configurations (candidate, micro-batch size) a kernel runs in sequence."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class MicroConfig:
    """Run candidate `algo` (e.g. 'legacy:FFT', ucudnn.execute.backends) on `batch` samples; measured
    `time_ms` and `workspace` bytes."""

    algo: str
    batch: int
    time_ms: float
    workspace: int


@dataclass(frozen=True)
class Configuration:
    """Micro-configurations run one after another on one stream, reusing one workspace:
    the time is the sum of the parts' times, the workspace the largest part's."""

    micro: tuple[MicroConfig, ...]

    @property
    def time_ms(self) -> float:
        return sum(m.time_ms for m in self.micro)

    @property
    def workspace(self) -> int:
        return max((m.workspace for m in self.micro), default=0)

    @property
    def batch(self) -> int:
        return sum(m.batch for m in self.micro)

    def describe(self, algo_name: Callable[[str], str] = str) -> str:
        """e.g. '2 x 128 legacy:FFT_TILING + 1 x 32 engines:eng0' (runs of equal parts grouped)."""
        groups: list[list] = []
        for m in self.micro:
            if groups and groups[-1][1:] == [m.batch, m.algo]:
                groups[-1][0] += 1
            else:
                groups.append([1, m.batch, m.algo])
        return " + ".join(f"{n} x {b} {algo_name(a)}" for n, b, a in groups)

    def to_json(self) -> list[dict]:
        return [vars(m).copy() for m in self.micro]

    @classmethod
    def from_json(cls, parts: list[dict]) -> Configuration:
        return cls(tuple(MicroConfig(**p) for p in parts))
