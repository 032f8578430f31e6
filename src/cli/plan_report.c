#include "plan_report.h"

#include <cjson/cJSON.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

void plan_report_begin(plan_report_t *r, int json, const char *kind) {
    r->json = json;
    r->root = cJSON_CreateObject();
    cJSON_AddStringToObject(r->root, "plan", kind);
    r->sec = r->root;
    r->assume = cJSON_AddArrayToObject(r->root, "assumptions");
}

void plan_report_section(plan_report_t *r, const char *key, const char *title) {
    r->sec = cJSON_AddObjectToObject(r->root, key);
    if (!r->json) printf("\n%s\n", title);
}

void plan_report_num(plan_report_t *r, const char *key, double v, const char *label, const char *fmt, ...) {
    cJSON_AddNumberToObject(r->sec, key, v);
    if (r->json) return;
    char text[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    printf("  %-40s %s\n", label, text);
}

void plan_report_str(plan_report_t *r, const char *key, const char *v, const char *label) {
    cJSON_AddStringToObject(r->sec, key, v);
    if (!r->json) printf("  %-40s %s\n", label, v);
}

void plan_report_assume(plan_report_t *r, const char *what, const char *value, const char *source) {
    cJSON *a = cJSON_CreateObject();
    cJSON_AddStringToObject(a, "what", what);
    cJSON_AddStringToObject(a, "value", value);
    cJSON_AddStringToObject(a, "source", source);
    cJSON_AddItemToArray(r->assume, a);
}

void plan_report_end(plan_report_t *r) {
    if (r->json) {
        char *s = cJSON_Print(r->root);
        printf("%s\n", s);
        free(s);
    } else {
        printf("\nassumptions (value: source)\n");
        const cJSON *a;
        cJSON_ArrayForEach(a, (cJSON *)r->assume)
            printf("  - %s = %s: %s\n", cJSON_GetObjectItem(a, "what")->valuestring,
                   cJSON_GetObjectItem(a, "value")->valuestring, cJSON_GetObjectItem(a, "source")->valuestring);
    }
    cJSON_Delete(r->root);
}

void plan_report_discard(plan_report_t *r) { cJSON_Delete(r->root); }

const char *plan_bytes(double b, char *buf, int cap) {
    if (b >= 1e9) snprintf(buf, (size_t)cap, "%.2f GB", b / 1e9);
    else if (b >= 1e6) snprintf(buf, (size_t)cap, "%.1f MB", b / 1e6);
    else snprintf(buf, (size_t)cap, "%.1f kB", b / 1e3);
    return buf;
}

const char *plan_duration(double s, char *buf, int cap) {
    if (s >= 2 * 86400) snprintf(buf, (size_t)cap, "%.1f days", s / 86400);
    else if (s >= 2 * 3600) snprintf(buf, (size_t)cap, "%.1f h", s / 3600);
    else if (s >= 120) snprintf(buf, (size_t)cap, "%.1f min", s / 60);
    else snprintf(buf, (size_t)cap, "%.3g s", s);
    return buf;
}
