"""SSH to a host as the inventory says: an unknown host key is refused unless the host opts in to first contact
(then it is recorded where pyinfra reads it), and a changed one is always refused with the line that fixes it."""

from types import SimpleNamespace

import paramiko
import pytest

from modelfleet.host import ssh


def plan(tmp_path, strict=None, port=2222):
    return SimpleNamespace(name="n1", address="10.0.0.5", ssh_port=port, ssh_user="root", ssh_key=None,
                           ssh_known_hosts_file=str(tmp_path / "known_hosts"), ssh_strict_host_key_checking=strict)


def test_an_unknown_key_is_refused_and_not_recorded(tmp_path):
    key = paramiko.ECDSAKey.generate()
    with pytest.raises(ssh.HostKeyError) as refused:
        ssh._FirstContact(plan(tmp_path)).missing_host_key(paramiko.SSHClient(), "[10.0.0.5]:2222", key)
    assert key.fingerprint in str(refused.value) and "ssh-keyscan -p 2222 10.0.0.5" in str(refused.value)
    assert not (tmp_path / "known_hosts").exists()


@pytest.mark.parametrize("strict", ["accept-new", "no", "off"])
def test_first_contact_records_the_key_where_pyinfra_reads_it(tmp_path, strict):
    key, client = paramiko.ECDSAKey.generate(), paramiko.SSHClient()
    ssh._FirstContact(plan(tmp_path, strict)).missing_host_key(client, "[10.0.0.5]:2222", key)
    recorded = paramiko.HostKeys(str(tmp_path / "known_hosts"))
    assert recorded.lookup("[10.0.0.5]:2222")[key.get_name()] == key
    assert client.get_host_keys().lookup("[10.0.0.5]:2222")[key.get_name()] == key


def test_a_changed_key_is_refused_with_the_line_that_removes_the_old_one(tmp_path):
    old, offered = paramiko.ECDSAKey.generate(), paramiko.ECDSAKey.generate()

    class Changed:
        def open(self):
            raise paramiko.BadHostKeyException("[10.0.0.5]:2222", offered, old)

    with pytest.raises(ssh.HostKeyError) as refused:
        ssh.open_checked(Changed(), plan(tmp_path, "accept-new"))  # first contact never covers a change
    assert "CHANGED" in str(refused.value) and offered.fingerprint in str(refused.value)
    assert f"ssh-keygen -R '[10.0.0.5]:2222' -f {tmp_path / 'known_hosts'}" in str(refused.value)


def test_the_connection_loads_the_known_hosts_file_and_keys_off_port_22_by_bracketed_name(tmp_path):
    key = paramiko.ECDSAKey.generate()
    (tmp_path / "known_hosts").write_text(f"[10.0.0.5]:2222 {key.get_name()} {key.get_base64()}\n")
    conn = ssh.connect(plan(tmp_path))
    assert conn.client.get_host_keys().lookup("[10.0.0.5]:2222")[key.get_name()] == key
    assert ssh._key_name(plan(tmp_path, port=22)) == "10.0.0.5"
