#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <stddef.h>
#include <immintrin.h>
float ggml_table_f32_f16[1 << 16];
float ggml_table_f32_e8m0_half[1 << 8];
float ggml_table_f32_ue4m3[1 << 8];
void ggml_abort(const char *file, int line, const char *fmt, ...) { fprintf(stderr, "abort %s:%d %s\n", file, line, fmt); abort(); }
size_t ggml_row_size(int type, int64_t ne) { (void)type; (void)ne; abort(); }
const char *ggml_type_name(int type) { (void)type; return "?"; }
size_t ggml_type_size(int type) { (void)type; abort(); }
__attribute__((constructor)) static void init_tables(void) { for (int i = 0; i < (1 << 16); i++) ggml_table_f32_f16[i] = _cvtsh_ss((uint16_t)i); }
