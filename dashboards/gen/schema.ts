// The type every Stepwise dashboard must satisfy, built from @grafana/schema (npm): its
// classic `Dashboard` model, with `panels` narrowed to the panel plugins the dashboards use so
// that their `options` and `fieldConfig.defaults.custom` are checked against the plugins'
// generated types too (the generic `Panel` types them as `Record<string, unknown>`).
// `cargo xtask test ecosystem` writes each dashboard as `const d: StepwiseDashboard = <JSON>`
// and runs `tsc --noEmit --strict`: a wrong field type, a misspelt field or an unknown enum
// value fails.
import type * as g from '@grafana/schema';
import type * as TimeSeries from '@grafana/schema/dist/esm/raw/composable/timeseries/panelcfg/x/TimeSeriesPanelCfg_types.gen';
import type * as Table from '@grafana/schema/dist/esm/raw/composable/table/panelcfg/x/TablePanelCfg_types.gen';

// JSON spells string enums (ThresholdsMode, LegendDisplayMode, …) by value: accept exactly
// their values; everything else keeps its type.
type Json<T> = T extends string
  ? `${T}`
  : T extends number | boolean | null | undefined
    ? T
    : T extends Array<infer U>
      ? Array<Json<U>>
      : T extends object
        ? { [K in keyof T]: Json<T[K]> }
        : T;

// The Prometheus data source's query model. @grafana/schema 13 no longer ships it (it moved
// into the data source plugin); these are the fields of Grafana's prometheus dataquery.cue
// that dashboards use.
interface PrometheusQuery extends Omit<g.DataQuery, 'datasource'> {
  datasource?: g.DataSourceRef;
  expr: string;
  legendFormat?: string;
  instant?: boolean;
  range?: boolean;
  exemplar?: boolean;
  format?: 'time_series' | 'table' | 'heatmap';
  editorMode?: 'code' | 'builder';
  interval?: string;
  intervalFactor?: number;
}

type FieldConfigSource<Custom> = Omit<g.FieldConfigSource, 'defaults'> & {
  defaults: Omit<g.FieldConfig, 'custom'> & { custom?: Custom };
};

type PanelBase = Omit<g.Panel, 'type' | 'options' | 'fieldConfig' | 'targets'> & { targets: PrometheusQuery[] };

interface TimeSeriesPanel extends PanelBase {
  type: 'timeseries';
  options: TimeSeries.Options;
  fieldConfig: FieldConfigSource<TimeSeries.FieldConfig>;
}

interface TablePanel extends PanelBase {
  type: 'table';
  options: Table.Options;
  fieldConfig: FieldConfigSource<Table.FieldConfig>;
}

export type StepwiseDashboard = Json<Omit<g.Dashboard, 'panels'> & { panels: Array<TimeSeriesPanel | TablePanel> }>;
