"""The mount at a path as /proc/self/mountinfo says (operations.mounts): the per-mount options of the mount
at exactly that path, the last one stacked there, octal escapes read; the fstab line escapes the same way."""

from modelfleet.host.operations.mounts import fstab_line, mount_options

INFO = """\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
90 22 259:0 / /srv/models rw,noatime shared:40 - xfs /dev/md0 rw,attr2
91 90 259:0 /.cache /srv/models/.cache rw,noatime shared:40 - xfs /dev/md0 rw,attr2
92 91 259:0 /.cache /srv/models/.cache rw,nosuid,nodev,noatime shared:40 - xfs /dev/md0 rw,attr2
93 22 8:1 /m /data\\040x/.cache rw,nosuid shared:1 - ext4 /dev/sda1 rw
"""


def test_the_last_mount_stacked_at_the_path_is_the_one_read():
    assert mount_options(INFO, "/srv/models/.cache") == {"rw", "nosuid", "nodev", "noatime"}
    assert mount_options(INFO, "/srv/models/.cache/") == {"rw", "nosuid", "nodev", "noatime"}
    assert mount_options(INFO, "/srv/models") == {"rw", "noatime"}


def test_a_path_below_a_mount_is_no_mount_point_and_escapes_are_read():
    assert mount_options(INFO, "/srv/models/x") is None and mount_options(None, "/") is None
    assert mount_options(INFO, "/data x/.cache") == {"rw", "nosuid"}
    assert fstab_line("/data x/.cache") == "/data\\040x/.cache /data\\040x/.cache none bind,nosuid,nodev,nofail 0 0"
