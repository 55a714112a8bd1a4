"""vit_keras.cpu: the CPU's vector extensions from /proc/cpuinfo."""

import pytest

from vit_keras.cpu import cpu_features

ZEN3 = "processor\t: 0\nmodel name\t: AMD EPYC 7B13\nflags\t\t: fpu sse2 avx avx2 fma\n\nprocessor\t: 1\n"
XEON = ("processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Processor\n"
        "flags\t\t: avx2 avx512f avx512_vnni avx512_bf16 amx_bf16 amx_int8 amx_tile\n")


def test_extensions_are_read_from_cpuinfo(tmp_path):
    (tmp_path / "zen3").write_text(ZEN3)
    (tmp_path / "xeon").write_text(XEON)
    zen3, xeon = cpu_features(str(tmp_path / "zen3")), cpu_features(str(tmp_path / "xeon"))
    assert zen3.name == "AMD EPYC 7B13" and zen3.has("AVX2") and not zen3.has("AVX-512")
    assert not zen3.bf16 and not zen3.int8_dot
    assert xeon.bf16 and xeon.int8_dot and xeon.has("AMX")
    assert xeon.describe().endswith(": AVX2, AVX-512, VNNI, BF16, AMX")
    assert zen3.describe().endswith(": AVX2")


def test_an_unreadable_cpuinfo_assumes_nothing(tmp_path):
    features = cpu_features(str(tmp_path / "missing"))
    assert features.flags == frozenset() and not features.bf16 and features.cores >= 1


def test_an_unknown_extension_is_named():
    with pytest.raises(ValueError, match="'SSE9'.*AVX2, AVX-512, VNNI, BF16, AMX"):
        cpu_features().has("SSE9")
