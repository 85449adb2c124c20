// Draws one generated Perses dashboard (charts/cpuslot/dashboards/perses/)
// with the Perses UI packages. The dashboard is ?dashboard=<file> (node,
// runtime); the queries go to the Prometheus that serve.mjs proxies at
// ./prometheus, the default datasource, whose scrape interval is
// ?scrapeInterval=<duration> (default 15s, the shipped scrape configuration's).
// Perses reads its own parameters from the URL too: start (e.g. 15m),
// refresh (0s: never), var-<name>.
import React from 'react';
import { createRoot } from 'react-dom/client';
import { QueryClient, QueryClientProvider } from '@tanstack/react-query';
import { ThemeProvider, CssBaseline, Alert, Typography } from '@mui/material';
import { QueryParamProvider } from 'use-query-params';
import { WindowHistoryAdapter } from 'use-query-params/adapters/window';
import { ChartsProvider, SnackbarProvider, generateChartsTheme, getTheme } from '@perses-dev/components';
import { PluginRegistry, dynamicImportPluginLoader } from '@perses-dev/plugin-system';
import { ViewDashboard } from '@perses-dev/dashboards';
import * as prometheus from '@perses-dev/prometheus-plugin';
import * as timeseries from '@perses-dev/timeseries-chart-plugin';
import * as stat from '@perses-dev/stat-chart-plugin';
import * as table from '@perses-dev/table-plugin';

// What each query (its text as the dashboard holds it, variables not
// replaced) returned: {state: 'loading' | 'ok' | 'error', series, points,
// error, and as run: executed (variables replaced), start, end (ISO), step (s)}.
// The screenshot driver (shots.mjs) reads it to tell a panel still loading,
// failed or empty, which the canvas-drawn charts do not show in the DOM.
window.cpuslotQueries = {};
const record = (query, result) => {
  window.cpuslotQueries[query] = { ...result, at: Date.now() };
};
const promQuery = prometheus.PrometheusTimeSeriesQuery;
const recordingPrometheus = {
  ...prometheus,
  PrometheusTimeSeriesQuery: {
    ...promQuery,
    getTimeSeriesData: async (spec, ctx) => {
      record(spec.query, { state: 'loading' });
      try {
        const data = await promQuery.getTimeSeriesData(spec, ctx);
        const series = data.series ?? [];
        const points = series.reduce((n, s) => n + (s.values ?? []).filter(([, v]) => v !== null).length, 0);
        record(spec.query, {
          state: 'ok',
          series: series.length,
          points,
          executed: data.metadata?.executedQueryString,
          start: data.timeRange?.start?.toISOString?.(),
          end: data.timeRange?.end?.toISOString?.(),
          step: data.stepMs === undefined ? undefined : data.stepMs / 1000,
        });
        return data;
      } catch (e) {
        record(spec.query, { state: 'error', error: String(e?.message ?? e) });
        throw e;
      }
    },
  },
};

const pluginLoader = dynamicImportPluginLoader(
  [recordingPrometheus, timeseries, stat, table].map((m) => ({
    resource: m.getPluginModule(),
    importPlugin: () => Promise.resolve(m),
  })),
);

const params = new URLSearchParams(window.location.search);

// The one datasource: the Prometheus behind serve.mjs. Its scrape interval
// is the smallest step of every query and sets $__rate_interval (4 x it at
// least); each query's range ends on a multiple of the step. Perses assumes
// 1m when it is not given: the last point drawn is then up to a minute old,
// and a Prometheus that started less than a minute ago draws nothing.
const scrapeInterval = params.get('scrapeInterval') ?? '15s';
const prometheusDatasource = {
  default: true,
  plugin: {
    kind: 'PrometheusDatasource',
    spec: { directUrl: new URL('prometheus', window.location.href).pathname, scrapeInterval },
  },
};
const datasourceApi = {
  buildProxyUrl: () => prometheusDatasource.plugin.spec.directUrl,
  getDatasource: async () => undefined,
  getGlobalDatasource: async () => ({
    kind: 'GlobalDatasource',
    metadata: { name: 'prometheus' },
    spec: prometheusDatasource,
  }),
  listDatasources: async () => [],
  listGlobalDatasources: async () => [
    { kind: 'GlobalDatasource', metadata: { name: 'prometheus' }, spec: prometheusDatasource },
  ],
};

const muiTheme = getTheme('light');
const chartsTheme = generateChartsTheme(muiTheme, {});
const queryClient = new QueryClient({ defaultOptions: { queries: { refetchOnWindowFocus: false, retry: 0 } } });

function App({ dashboard }) {
  return (
    <ThemeProvider theme={muiTheme}>
      <CssBaseline />
      <ChartsProvider chartsTheme={chartsTheme}>
        <SnackbarProvider anchorOrigin={{ vertical: 'top', horizontal: 'right' }}>
          <QueryClientProvider client={queryClient}>
            <QueryParamProvider adapter={WindowHistoryAdapter}>
              <PluginRegistry pluginLoader={pluginLoader}>
                <ViewDashboard
                  dashboardResource={dashboard}
                  datasourceApi={datasourceApi}
                  isReadonly={true}
                  isVariableEnabled={true}
                  isDatasourceEnabled={false}
                  isEditing={false}
                  dashboardTitleComponent={<Typography variant="h2">{dashboard.spec.display?.name ?? dashboard.metadata.name}</Typography>}
                />
              </PluginRegistry>
            </QueryParamProvider>
          </QueryClientProvider>
        </SnackbarProvider>
      </ChartsProvider>
    </ThemeProvider>
  );
}

const root = createRoot(document.getElementById('root'));
const name = params.get('dashboard') ?? 'node';
(/^[1-9][0-9]*(ms|s|m|h)$/.test(scrapeInterval)
  ? fetch(`dashboards/${encodeURIComponent(name)}.json`)
  : Promise.reject(new Error(`scrapeInterval must be a duration like 15s, got ${JSON.stringify(scrapeInterval)}`))
)
  .then((r) => {
    if (!r.ok) throw new Error(`dashboard ${name}: HTTP ${r.status}`);
    return r.json();
  })
  .then((d) => root.render(<App dashboard={d} />))
  .catch((e) => root.render(<Alert severity="error">{String(e)}</Alert>));
