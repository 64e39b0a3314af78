# Compiles an ONNX model with ONNX Runtime's graph optimiser (run by
# strata compile --backend ort). Argument: a JSON object with model,
# optimized, data_name, level, ort_format. Prints a JSON report.
import json
import sys
import time

import onnxruntime as ort

args = json.loads(sys.argv[1])
levels = {"basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
          "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
          "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL}
report = {"onnxruntime": ort.__version__, "level": args["level"]}

opts = ort.SessionOptions()
opts.graph_optimization_level = levels[args["level"]]
opts.optimized_model_filepath = args["optimized"]
opts.add_session_config_entry("session.optimized_model_external_initializers_file_name", args["data_name"])
opts.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "1024")
start = time.time()
ort.InferenceSession(args["model"], opts, providers=["CPUExecutionProvider"])
report["optimize_seconds"] = round(time.time() - start, 3)

if args["ort_format"]:
    fmt = ort.SessionOptions()
    fmt.graph_optimization_level = levels[args["level"]]
    fmt.optimized_model_filepath = args["ort_path"]
    fmt.add_session_config_entry("session.save_model_format", "ORT")
    try:
        ort.InferenceSession(args["model"], fmt, providers=["CPUExecutionProvider"])
        report["ort_format"] = args["ort_path"]
    except Exception as e:  # the ORT format has limits (e.g. no external data); say why
        report["ort_format_skipped"] = str(e).splitlines()[0][:500]

json.dump(report, sys.stdout)
