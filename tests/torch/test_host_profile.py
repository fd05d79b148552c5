"""The host profile file: what it refuses, in one line."""

from __future__ import annotations

import pytest

from poetlab.torch.host_profile import HostProfile, ProfileFileError


@pytest.mark.parametrize(
    "text,match",
    [
        ("{not json", "not valid JSON"),
        ('{"format": "other"}', "not a poetlab host profile"),
        ('{"format": "poetlab.HostProfile", "version": 1}', "missing field"),
        ('{"format": "poetlab.HostProfile", "version": 99}', "version 99 is not supported"),
    ],
)
def test_corrupt_profile_is_one_line(tmp_path, text, match):
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(ProfileFileError, match=match) as info:
        HostProfile.load(path)
    assert "\n" not in str(info.value)
