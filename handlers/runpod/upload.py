"""Outputs too large to return inline go to S3 (or any S3-compatible store: boto3 honours
AWS_ENDPOINT_URL and the usual AWS credential variables); the job returns a presigned URL."""

from __future__ import annotations

from ttsengine import TTSError


class UploadError(TTSError):
    """The bucket is missing, unreachable or refuses the write."""


def upload(data: bytes, bucket: str, key: str, content_type: str, expires: int) -> str:
    """-> a presigned GET URL for s3://bucket/key, valid `expires` seconds."""
    import boto3
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        s3 = boto3.client("s3")
        s3.put_object(Bucket=bucket, Key=key, Body=data, ContentType=content_type)
        return s3.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": key}, ExpiresIn=expires)
    except (BotoCoreError, ClientError) as e:
        raise UploadError(f"upload to s3://{bucket}/{key} failed: {e}") from None
