#!/usr/bin/env bash
# Regenerates the Go code for sdk/onnx and sdk/proto. Needs protoc (here from
# grpcio-tools), protoc-gen-go and protoc-gen-go-grpc; `make proto` installs them
# into .venv/tools. The generated files are committed: building strata needs none of this.
set -euo pipefail
cd "$(dirname "$0")/../.."
tools=.venv/tools/bin
PATH="$PWD/$tools:$PATH" "$tools/python" -m grpc_tools.protoc -I . \
  --go_out=. --go_opt=module=github.com/strata-llm/strata \
  --go-grpc_out=. --go-grpc_opt=module=github.com/strata-llm/strata \
  sdk/onnx/onnx.proto sdk/proto/pluginv1/plugin.proto
