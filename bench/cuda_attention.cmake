# Included from bench/CMakeLists.txt when the CUDA backend is on: the paged attention kernel lab.
add_executable(bench_cuda_attention ${CMAKE_CURRENT_LIST_DIR}/cuda_attention_bench.cpp)
target_link_libraries(bench_cuda_attention PRIVATE exl3_cuda exl3_options)

add_executable(bench_cuda_gemv ${CMAKE_CURRENT_LIST_DIR}/cuda_gemv_bench.cpp)
target_link_libraries(bench_cuda_gemv PRIVATE exl3_cuda exl3_options)

add_executable(bench_cuda_exl3 ${CMAKE_CURRENT_LIST_DIR}/cuda_exl3_bench.cpp)
target_link_libraries(bench_cuda_exl3 PRIVATE exl3_cuda exl3_options)

add_executable(bench_cuda_int_lab ${CMAKE_CURRENT_LIST_DIR}/lab/cuda_int_lab.cu)
set_target_properties(bench_cuda_int_lab PROPERTIES CUDA_STANDARD 17)

add_executable(bench_cuda_decode_lab ${CMAKE_CURRENT_LIST_DIR}/lab/cuda_decode_lab.cu)
set_target_properties(bench_cuda_decode_lab PROPERTIES CUDA_STANDARD 17)
target_include_directories(bench_cuda_decode_lab PRIVATE ${PROJECT_SOURCE_DIR}/src)

add_executable(bench_cuda_hop_lab ${CMAKE_CURRENT_LIST_DIR}/lab/cuda_hop_lab.cu)
set_target_properties(bench_cuda_hop_lab PROPERTIES CUDA_STANDARD 17)
target_include_directories(bench_cuda_hop_lab PRIVATE ${PROJECT_SOURCE_DIR}/src)

add_executable(bench_cuda_moe ${CMAKE_CURRENT_LIST_DIR}/cuda_moe_bench.cpp)
target_link_libraries(bench_cuda_moe PRIVATE exl3_cuda exl3_cpu exl3_options)

# Tensor parallelism: the one-rank sharded path against the plain executor, and the all-reduces of a step over GPUs.
add_executable(bench_cuda_tp ${CMAKE_CURRENT_LIST_DIR}/cuda_tp_bench.cpp)
target_link_libraries(bench_cuda_tp PRIVATE exl3_models exl3_options)

# The step timeline lab (bench/lab/step_trace_lab.cpp): only where the kernels record one.
if(EXL3_STEP_TRACE)
  add_executable(step_trace_lab ${CMAKE_CURRENT_LIST_DIR}/lab/step_trace_lab.cpp)
  target_link_libraries(step_trace_lab PRIVATE exl3_models exl3_cuda exl3_options)
  target_include_directories(step_trace_lab PRIVATE ${PROJECT_SOURCE_DIR}/src)
endif()
