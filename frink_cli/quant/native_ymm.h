/* The 256-bit regions' parameters (AVX2, with and without AVX-VNNI): native.c defines
 * ISA and I8_DOT_ACC, includes this, then native_isa.h, which undefines them all for the
 * next region. vf256 is native.c's. */
#define VL 8
#define vf vf256
#define VFMA(a, b, c) ((vf256)_mm256_fmadd_ps((__m256)(a), (__m256)(b), (__m256)(c)))
#define HALF(p) _cvtsh_ss(rd16(p))
#define HALVES(p) ((vf256)_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p))))
#define HALF_OF(b, i) ((i) ? _mm_unpackhi_epi64((__m128i)(b), (__m128i)(b)) : (__m128i)(b))
#define U8F(b, i) ((vf256)_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(HALF_OF(b, i))))
#define S8F(b, i) ((vf256)_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(HALF_OF(b, i))))
