# Included from bench/CMakeLists.txt: the tokenizer benchmark (Google Benchmark).
find_package(benchmark REQUIRED)
add_executable(tokenizer_bench ${CMAKE_CURRENT_LIST_DIR}/tokenizer_bench.cpp)
target_link_libraries(tokenizer_bench PRIVATE exl3_tokenizer exl3_options benchmark::benchmark)
target_compile_definitions(tokenizer_bench PRIVATE EXL3_SHARED_DIR_DEFAULT="${CMAKE_SOURCE_DIR}/../shared")
