"""Where stormdrop meets TVM's own interfaces, and the one place where it works around rough
edges of TVM 0.27, each in the module of its topic:

- ``intrinsics``: the tensor intrinsics a target needs, imported cheaply; the pooling schedule
  rules TVM names but does not define; CPU sketches without rfactor of a pooling window.
- ``runtime``: the CPU runtime's thread count, ``export_library`` without its per-item noise;
  notes on PyTorch at TVM-FFI's import and on candidate libraries' leaked memory.
- ``relax_passes``: the ONNX importer's ``Clip``, ``CombineParallelMatmul`` on inline weights,
  ``FoldConstant`` on weight prepacks, ``ConvertLayout`` on negative squeeze axes, the GPU default
  schedule.
- ``tir_pipeline``: vector loops over element-wise blocks that cross a row of the innermost
  axis, which TVM's lowering turns into lane-by-lane loads and stores: split first.
- ``trace_json``: TVM's JSON formats (traces, object graphs), which its decoders crash on
  instead of raising for some inputs (its notes say which).
- ``nvrtc``: CUDA sources compiled to cubins on the host (its notes say why).
- ``isolated``: the child process that keeps TVM's crashes on untrusted files away.
- ``rpc``: TVM's tracker client without its minute of silent retries of a refused port.
- ``cross``: libraries for another CPU architecture (an ARM board), linked by its cross compiler.

One rough edge is handled where the user's stop lives, ``stormdrop.stop``: an exception raised in
Python code that TVM calls back comes out as ``RuntimeError``, or aborts the process where TVM
calls back from a C++ destructor (MetaSchedule's logger), so Ctrl-C is remembered and deferred.
"""
