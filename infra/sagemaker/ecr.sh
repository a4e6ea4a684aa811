#!/usr/bin/env bash
# Build, tag and push the image to ECR: infra/sagemaker/ecr.sh REPOSITORY [TAG] [REGION]
# Creates the repository when missing; prints the image URI to pass to `deploy --image`.
set -euo pipefail
cd "$(dirname "$0")/../.."
REPO=${1:?usage: infra/sagemaker/ecr.sh REPOSITORY [TAG] [REGION]} TAG=${2:-$(git rev-parse --short HEAD)}
REGION=${3:-${AWS_DEFAULT_REGION:-$(aws configure get region || true)}}
[ -n "$REGION" ] || { echo "ecr: no region (third argument or AWS_DEFAULT_REGION)" >&2; exit 1; }
ACCOUNT=$(aws sts get-caller-identity --query Account --output text) || { echo "ecr: no AWS credentials" >&2; exit 1; }
REGISTRY=$ACCOUNT.dkr.ecr.$REGION.amazonaws.com
aws ecr describe-repositories --region "$REGION" --repository-names "$REPO" >/dev/null 2>&1 \
  || aws ecr create-repository --region "$REGION" --repository-name "$REPO" >/dev/null
aws ecr get-login-password --region "$REGION" | docker login --username AWS --password-stdin "$REGISTRY" >/dev/null
docker build -t "$REPO:$TAG" ${BASE_IMAGE:+--build-arg BASE_IMAGE="$BASE_IMAGE"} .
docker tag "$REPO:$TAG" "$REGISTRY/$REPO:$TAG"
docker push "$REGISTRY/$REPO:$TAG" >/dev/null
echo "$REGISTRY/$REPO:$TAG"
