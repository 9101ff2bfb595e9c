/* The C API through the header and the shared library, on a simulated card. */
#include <stdio.h>
#include <string.h>
#include "cupool.h"

#define CHECK(cond) do { if (!(cond)) { fprintf(stderr, "%s:%d: %s (%s)\n", __FILE__, __LINE__, #cond, cupool_last_error()); return 1; } } while (0)

int main(void) {
    CHECK(cupool_api_version() == CUPOOL_API_VERSION);
    const char *settings = cupool_settings_json();
    CHECK(settings != NULL && strstr(settings, "\"name\":\"GGML_POOL\"") != NULL);
    CHECK(cupool_init("CUPOOL_DEVICE=sim CUPOOL_SIM_GIB=1 GGML_POOL=legacy") == CUPOOL_STATUS_OK);
    size_t actual = 0;
    void *p = cupool_alloc(0, 0, 1 << 20, &actual);
    CHECK(p != NULL && actual >= (1 << 20));
    CHECK(cupool_free(0, 0, p, (1 << 20) + 1) == CUPOOL_STATUS_SIZE_MISMATCH);
    CHECK(strstr(cupool_last_error(), "freed with") != NULL);
    CHECK(cupool_free(0, 0, p, 1 << 20) == CUPOOL_STATUS_OK);
    CHECK(cupool_free(0, 0, p, 1 << 20) == CUPOOL_STATUS_UNKNOWN_POINTER);
    char json[1024];
    size_t n = cupool_stats_json(0, json, sizeof json);
    CHECK(n > 0 && n < sizeof json && strstr(json, "\"allocation.all.freed\":1") != NULL);
    size_t released = 0;
    CHECK(cupool_purge(0, 0, &released) == CUPOOL_STATUS_OK && released > 0);
    CHECK(cupool_shutdown() == CUPOOL_STATUS_OK);
    printf("c smoke: ok (%s)\n", json);
    return 0;
}
