"""What remote repository URLs name, and the credentials each takes from the environment."""

from __future__ import annotations

import tomllib

import pytest

from coreserve.errors import InvalidArgumentError
from coreserve.repository.storage._remote import EXTRAS
from coreserve.repository.storage._stores import store_location
from support.paths import REPO

KEY = "c2VjcmV0LWtleS1vZi10aGUtdGVzdA=="
CORE_PYPROJECT = REPO / "core" / "pyproject.toml"


def test_s3_urls_may_name_an_endpoint() -> None:
    plain = store_location("s3://models/repo/", {})
    assert (plain.protocol, plain.prefix, plain.options, plain.bucket) == ("s3", "models/repo", {}, "models")
    local = store_location("s3://127.0.0.1:9000/models/repo", {})
    assert local.prefix == "models/repo"
    assert local.options == {"client_kwargs": {"endpoint_url": "http://127.0.0.1:9000"}}


def test_gs_urls_use_gcsfs_plain_filesystem_with_an_emulator() -> None:
    assert store_location("gs://models/repo", {}).filesystem is None
    emulated = store_location("gs://models/repo", {"STORAGE_EMULATOR_HOST": "http://127.0.0.1:9023"})
    assert (emulated.protocol, emulated.prefix) == ("gs", "models/repo")
    assert emulated.filesystem == "gcsfs.core.GCSFileSystem"


def test_as_urls_name_account_and_container_and_read_a_connection_string() -> None:
    text = f"DefaultEndpointsProtocol=http;AccountName=acct1;AccountKey={KEY};BlobEndpoint=http://127.0.0.1:1/acct1"
    location = store_location("as://acct1/models/repo/", {"AZURE_STORAGE_CONNECTION_STRING": text})
    assert (location.protocol, location.prefix, location.bucket) == ("az", "models/repo", "models")
    assert location.options == {"connection_string": text}
    assert location.bucket_word == "container"
    assert location.owner == "Azure Storage account 'acct1'"
    assert location.redact(f"failed: {text}") == (
        "failed: DefaultEndpointsProtocol=http;AccountName=acct1;AccountKey=<secret>;"
        "BlobEndpoint=http://127.0.0.1:1/acct1"
    )


def test_as_urls_take_account_and_key_as_triton_does() -> None:
    location = store_location(
        "as://acct1/models", {"AZURE_STORAGE_ACCOUNT": "acct1", "AZURE_STORAGE_KEY": KEY}
    )
    assert location.prefix == "models"
    assert location.options == {"account_name": "acct1", "account_key": KEY}
    assert KEY not in location.redact(f"key {KEY}")
    # The connection string wins over the pair, as the more specific setting.
    text = f"AccountName=acct1;AccountKey={KEY}"
    both = store_location(
        "as://acct1/models", {"AZURE_STORAGE_CONNECTION_STRING": text, "AZURE_STORAGE_KEY": "other"}
    )
    assert both.options == {"connection_string": text}


def test_as_urls_without_a_key_leave_the_credential_to_azure() -> None:
    location = store_location("as://acct1/models/repo", {})
    assert location.options == {"account_name": "acct1"}  # adlfs asks DefaultAzureCredential
    assert location.secrets == ()


@pytest.mark.parametrize(
    ("environ", "words"),
    [
        (
            {"AZURE_STORAGE_CONNECTION_STRING": f"AccountName=other1;AccountKey={KEY}"},
            "AZURE_STORAGE_CONNECTION_STRING is for the account 'other1', the URL names the account 'acct1'",
        ),
        (
            {"AZURE_STORAGE_ACCOUNT": "other1", "AZURE_STORAGE_KEY": KEY},
            "AZURE_STORAGE_KEY is the key of the account 'other1' (AZURE_STORAGE_ACCOUNT), "
            "the URL names the account 'acct1'",
        ),
    ],
)
def test_credentials_of_another_account_are_refused(environ: dict[str, str], words: str) -> None:
    with pytest.raises(InvalidArgumentError) as caught:
        store_location("as://acct1/models", environ)
    assert caught.value.message == f"model repository as://acct1/models: {words}"
    assert KEY not in caught.value.message


@pytest.mark.parametrize(
    ("url", "words"),
    [
        (
            "as://acct1",
            "an Azure Storage URL names an account and a container: as://ACCOUNT/CONTAINER[/PATH]",
        ),
        (
            "as://acct1/",
            "an Azure Storage URL names an account and a container: as://ACCOUNT/CONTAINER[/PATH]",
        ),
        (
            "as:///models",
            "an Azure Storage URL names an account and a container: as://ACCOUNT/CONTAINER[/PATH]",
        ),
        (
            "as://ab/models",
            "'ab' is not an Azure Storage account name (3 to 24 lower-case letters and digits)",
        ),
        ("as://acct1/Models", "'Models' is not an Azure Storage container name"),
        ("as://acct1/a--b", "'a--b' is not an Azure Storage container name"),
    ],
)
def test_malformed_as_urls_are_refused(url: str, words: str) -> None:
    with pytest.raises(InvalidArgumentError) as caught:
        store_location(url, {})
    assert caught.value.message.startswith(f"model repository {url}: {words}")


def test_every_extra_a_missing_filesystem_message_names_exists() -> None:
    extras = tomllib.loads(CORE_PYPROJECT.read_text())["project"]["optional-dependencies"]
    expected = {"s3": "s3fs", "gs": "gcsfs", "gcs": "gcsfs", "as": "adlfs"}
    assert set(EXTRAS) == set(expected)
    for scheme, extra in EXTRAS.items():
        name = extra.removeprefix("core-server[").removesuffix("]")
        assert any(requirement.startswith(expected[scheme]) for requirement in extras[name]), scheme
