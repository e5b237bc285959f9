import pytest

from hipipe.errors import HipipeError
from hipipe.units import (
    format_size,
    format_time,
    parse_bandwidth_bytes_per_s,
    parse_size_bytes,
    parse_sizes_bytes,
    parse_time_s,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1MiB", 2**20),
        ("64 MiB", 2**26),
        ("1GiB", 2**30),
        ("1GB", 10**9),
        ("4096", 4096),
        ("1.5KiB", 1536),
        ("2k", 2048),
    ],
)
def test_sizes(text: str, expected: int) -> None:
    assert parse_size_bytes(text) == expected


@pytest.mark.parametrize("text", ["0", "-1MiB", "1.5", "abc", "1 parsec", ""])
def test_bad_sizes_are_rejected(text: str) -> None:
    with pytest.raises(HipipeError):
        parse_size_bytes(text)


def test_size_list() -> None:
    assert parse_sizes_bytes("1MiB,16MiB") == [2**20, 2**24]


def test_bandwidth_and_time() -> None:
    assert parse_bandwidth_bytes_per_s("100GB/s") == 100e9
    assert parse_bandwidth_bytes_per_s("400Gbit/s") == 50e9
    assert parse_bandwidth_bytes_per_s("50Mbit") == pytest.approx(50e6 / 8)
    assert parse_time_s("500ns") == pytest.approx(5e-7)
    assert parse_time_s("2us") == pytest.approx(2e-6)
    with pytest.raises(HipipeError):
        parse_bandwidth_bytes_per_s("-5GB/s")
    with pytest.raises(HipipeError):
        parse_time_s("5 fortnights")


def test_formatting() -> None:
    assert format_size(2**30) == "1 GiB"
    assert format_size(100) == "100 B"
    assert format_time(1.5e-3) == "1.500 ms"
    assert format_time(2.5e-6) == "2.50 us"
