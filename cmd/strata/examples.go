package main

// examples are the EXAMPLES section of each command's --help.
var examples = map[string]string{
	"archs": `strata archs                        # plugins found, what they handle, their options
strata archs --json --plugin-dir ./bin`,
	"inspect": `strata inspect ./Llama-3.1-8B             # a checkpoint directory
strata inspect Qwen/Qwen3-30B-A3B         # a hub id in the local Hugging Face cache
strata inspect ~/.cache/huggingface/hub/models--Qwen--Qwen3-30B-A3B --revision v1.0
strata inspect --json MODEL | jq .config  # machine-readable; exit 1 when strata cannot export it`,
	"export": `strata export ./Llama-3.1-8B --out out/llama           # weights referenced in place (reflink clones, else hard links)
strata export meta-llama/Llama-3.1-8B --out out/llama  # from the Hugging Face cache, offline
strata export MODEL --out out/m --dtype float16 --subfunctions
strata export MODEL --out out/m --layerwise --window-size 4 -j 8 --keep-windows
strata export MODEL --out out/m --weights materialize --weight-spec qaic
strata export ./Qwen3-8B --out out/q --target ort      # ONNX Runtime's form: onnxruntime_genai.Model("out/q") runs it
strata export Qwen/Qwen3-30B-A3B --out out/q --moe-strategy dense   # a plugin option
strata export MODEL --out out/m --link copy            # for the onnx package on a file system without reflink
strata export MODEL --out out/m --json --stats -       # results as JSON on stdout`,
	"check": `strata check out/llama          # does it parse, is its data there, who loads it
strata check out/llama --json   # exit 1 when the export is broken`,
	"convert": `strata convert ./Qwen3-30B-A3B --out ./q-bf16 --dtype bfloat16
strata convert ./model --out ./model-fp8 --quantize fp8-block        # transformers' FineGrainedFP8
strata convert ./model --out ./model-fp8d --quantize fp8-dynamic     # compressed-tensors FP8_DYNAMIC
strata convert ./gpt-oss-120b --out ./gpt-bf16 --dtype bfloat16      # MXFP4 dequantised
strata convert MODEL --out /shared/out --layers 0-47 && strata convert MODEL --out /shared/out --layers 48-93
strata convert MODEL --out /shared/out --finalize                    # once every layer is there`,
	"compile": `strata compile MODEL --out out/c --dry-run                 # write compile.sh, do not compile
strata compile out/llama --out out/c --ctx-len 4096 --prefill-seq-len 128 --num-devices 4
strata compile out/llama --out out/c --mxfp6-matmul --mxint8-kv-cache
strata compile out/llama --out out/ort --backend ort --ort-level all
strata compile MODEL --out out/c --layerwise --compile-per-window -j 4 --json`,
	"convert-bin": `strata convert-bin ./gpt-model-bin --out ./gpt-model-safetensors
strata convert-bin org/name --out ./name-safetensors   # a .bin checkpoint in the Hugging Face cache`,
	"version": `strata version
strata --version`,
	"completion": `eval "$(strata completion bash)"                 # in ~/.bashrc
strata completion zsh > "${fpath[1]}/_strata"
strata completion fish > ~/.config/fish/completions/strata.fish`,
}
