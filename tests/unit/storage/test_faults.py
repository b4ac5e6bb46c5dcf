"""Backend errors become StorageError in one place, and every backend error class is covered."""

from __future__ import annotations

import errno

import aiohttp
import botocore.exceptions
import fsspec.exceptions
import pytest
import s3fs.errors
from botocore.exceptions import ClientError, EndpointConnectionError, ReadTimeoutError

from grove.storage import MissingBlobError, StorageError, StorageUnavailableError
from grove.storage.faults import BACKEND_ERRORS, READ, backend_errors, translate

URL = "s3://bucket/prefix"
KEY = "staging/cap-1/call-1"


def _subclasses(root: type[BaseException]) -> set[type[BaseException]]:
    found = {root}
    for subclass in root.__subclasses__():
        found |= _subclasses(subclass)
    return found


# The roots of what botocore, aiohttp and fsspec raise from client calls; their other classes
# (warnings, model-loading and argument errors) are programming errors and stay untranslated.
CLIENT_ERROR_CLASSES = sorted(
    set().union(
        *map(
            _subclasses,
            (
                botocore.exceptions.BotoCoreError,
                botocore.exceptions.ClientError,
                aiohttp.ClientError,
                fsspec.exceptions.FSTimeoutError,
            ),
        )
    ),
    key=lambda cls: (cls.__module__, cls.__qualname__),
)


@pytest.mark.parametrize("error_class", CLIENT_ERROR_CLASSES, ids=lambda cls: cls.__qualname__)
def test_every_library_client_error_translates_to_storage_unavailable(error_class):
    error = error_class.__new__(error_class)  # constructors differ; the class is what matters
    translated = translate(error, operation="get", key=KEY, store_url=URL)
    assert isinstance(translated, StorageUnavailableError)


@pytest.mark.parametrize(
    "error",
    [
        PermissionError(errno.EACCES, "Access Denied"),
        OSError(121, "We encountered an internal error. Please try again."),
        TimeoutError("timed out"),
        ConnectionRefusedError(111, "refused"),
        FileExistsError("exists"),
        EndpointConnectionError(endpoint_url="http://127.0.0.1:9"),
        ReadTimeoutError(endpoint_url="http://127.0.0.1:9"),
        botocore.exceptions.NoCredentialsError(),
        ClientError({"Error": {"Code": "SlowDown", "Message": "slow"}}, "PutObject"),
        aiohttp.ClientConnectionError("reset"),
        fsspec.exceptions.FSTimeoutError(),
    ],
    ids=lambda error: type(error).__name__,
)
def test_backend_errors_translate_to_storage_unavailable_naming_operation_and_key(error):
    translated = translate(error, operation="put", key=KEY, store_url=URL)
    assert isinstance(translated, StorageUnavailableError)
    assert (translated.operation, translated.key, translated.store_url) == ("put", KEY, URL)
    assert type(error).__name__ in translated.detail


def test_s3fs_translated_client_errors_are_os_errors():
    error = ClientError({"Error": {"Code": "InternalError", "Message": "boom"}}, "GetObject")
    assert isinstance(s3fs.errors.translate_boto_error(error), BACKEND_ERRORS)


def test_file_not_found_while_reading_becomes_missing_blob_with_capture_key():
    translated = translate(FileNotFoundError(KEY), operation=READ, key=KEY, store_url=URL)
    assert isinstance(translated, MissingBlobError)
    assert (translated.key, translated.capture_key, translated.store_url) == (KEY, "cap-1", URL)


def test_file_not_found_while_writing_means_the_store_is_unavailable():
    translated = translate(
        FileNotFoundError("NoSuchBucket"), operation="put", key=KEY, store_url=URL
    )
    assert isinstance(translated, StorageUnavailableError)


def test_storage_errors_pass_through_unchanged():
    error = MissingBlobError(KEY, "cap-1", URL)
    assert translate(error, operation=READ, key=KEY, store_url=URL) is error


def test_backend_errors_context_raises_the_translation_chained_to_the_cause():
    cause = ConnectionResetError(104, "reset")
    with (
        pytest.raises(StorageUnavailableError, match=r"failed to list key None") as info,
        backend_errors("list", None, URL),
    ):
        raise cause
    assert info.value.__cause__ is cause


def test_programming_errors_are_not_translated():
    with pytest.raises(ZeroDivisionError), backend_errors("put", KEY, URL):
        raise ZeroDivisionError


def test_every_storage_error_derives_from_the_root():
    import grove.storage.errors as errors

    classes = [getattr(errors, name) for name in errors.__all__]
    assert all(issubclass(cls, StorageError) for cls in classes)
