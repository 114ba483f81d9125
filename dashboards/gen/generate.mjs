#!/usr/bin/env node
// Generates the five Stepwise Grafana dashboards (classic JSON model, schemaVersion 42 as in
// @grafana/schema 13) from one description, so variables, selectors, units and layout stay
// consistent. Usage: node dashboards/gen/generate.mjs [OUT_DIR]   (default: dashboards/ and
// deploy/helm/stepwise/files/dashboards/)
// The generated JSON is committed; `cargo xtask test ecosystem` regenerates it and fails on
// any difference, type-checks it against @grafana/schema, and tests/tests/dashboards.rs runs
// every panel's query against a real Prometheus scraping real agents.

import { mkdirSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const SCHEMA_VERSION = 42;
const DS = { type: 'prometheus', uid: '${datasource}' };

// Every query is scoped by the dashboard variables. `instance` is the scrape target: one
// agent, i.e. one host.
const SEL = 'cluster=~"$cluster", job=~"$job", instance=~"$host"';
// Who a rank is: its process's Kubernetes namespace and pod and its local rank, labels of the
// per-rank series themselves (empty when unknown; All is `.*`, which matches empty too). Not
// `namespace`/`pod`: the Prometheus Operator sets those to the agent's own pod (target labels).
const SEL_POD = `${SEL}, k8s_namespace_name=~"$namespace", k8s_pod_name=~"$pod"`;
const SEL_WHO = `${SEL_POD}, local_rank=~"$local_rank"`;
const SEL_RANK = `${SEL_WHO}, rank=~"$rank"`;
const RI = '$__rate_interval';

// ---- variables -----------------------------------------------------------------------------

function queryVar(name, label, query, description) {
  return {
    type: 'query',
    name,
    label,
    description,
    datasource: DS,
    query,
    refresh: 2, // on time range change: agents come and go
    includeAll: true,
    allValue: '.*', // also matches series without the label (e.g. no `cluster` external label)
    multi: true,
    sort: 1,
    regex: '',
    hide: 0,
    current: { text: ['All'], value: ['$__all'] },
    options: [],
  };
}

const VARIABLES = [
  {
    type: 'datasource',
    name: 'datasource',
    label: 'Data source',
    query: 'prometheus',
    refresh: 1,
    regex: '',
    hide: 0,
    includeAll: false,
    multi: false,
    options: [],
  },
  queryVar('cluster', 'Cluster', 'label_values(stepwise_build_info, cluster)', 'The `cluster` label (an external label of your Prometheus); All also matches series without it.'),
  queryVar('job', 'Job', 'label_values(stepwise_build_info{cluster=~"$cluster"}, job)', 'Prometheus scrape job of the agents.'),
  queryVar('host', 'Host', 'label_values(stepwise_build_info{cluster=~"$cluster", job=~"$job"}, instance)', 'One agent per host: the scrape target (`instance`).'),
  queryVar('namespace', 'Namespace', `label_values(stepwise_rank_wait_seconds_total{${SEL}}, k8s_namespace_name)`, "Kubernetes namespace of the training job's pods (`k8s_namespace_name` on the per-rank series; none outside Kubernetes). The series' `namespace` is the agent's, a target label."),
  queryVar('pod', 'Pod', `label_values(stepwise_rank_wait_seconds_total{${SEL}, k8s_namespace_name=~"$namespace"}, k8s_pod_name)`, "The training job's pods (`k8s_pod_name` on the per-rank series; none outside Kubernetes). The series' `pod` is the agent's, a target label."),
  queryVar('local_rank', 'Local rank', `label_values(stepwise_rank_wait_seconds_total{${SEL_POD}}, local_rank)`, 'Rank within its host (LOCAL_RANK, OMPI_COMM_WORLD_LOCAL_RANK, SLURM_LOCALID…): GPU i of every node.'),
  queryVar('rank', 'Rank', `label_values(stepwise_rank_wait_seconds_total{${SEL_WHO}}, rank)`, 'Global ranks of the selected pods and local ranks (at most 64 values per host at a time, then `other`).'),
  {
    type: 'textbox',
    name: 'comm',
    label: 'Communicator',
    description:
      'Communicators are not Prometheus labels (a new id per job would grow series without bound). Type a communicator id to carry it in the dashboard links; per-communicator detail is in the agent API (/api/v1/collectives) and `agent diagnose`.',
    query: '',
    hide: 0,
    current: { text: '', value: '' },
    options: [],
  },
];

// ---- panels --------------------------------------------------------------------------------

let nextId = 1;

// A healthy node shows 0, not "No data": a counter family is born with its first event (the
// ranks' waits, TCP retransmissions, probe drops…) and rate() needs two samples, so every
// range query over counters ends in a fallback: per host (`or on(instance)` the host's
// stepwise_build_info times 0) when the query is by instance, else one 0 (`or on() vector(0)`).
// Gauges that mean nothing before the first step (step percentiles, rail shares) and the
// instant tables get none: "No data" is the truth there. tests/tests/dashboards.rs checks
// every query on an idle agent (with the fallback) and on the loaded ones (without it).
const ZERO_BY_HOST = ` or on(instance) 0 * group by (instance) (stepwise_build_info{${SEL}})`;
const ZERO = ' or on() vector(0)';

function target(refId, expr, legendFormat, extra = {}) {
  const counters = /\b(rate|increase)\(/.test(expr) && !expr.startsWith('histogram_quantile') && !extra.instant;
  if (counters) expr += /^\w+ by \(instance\b/.test(expr) ? ZERO_BY_HOST : ZERO;
  return { refId, datasource: DS, expr, legendFormat, range: true, instant: false, editorMode: 'code', ...extra };
}

function timeseries(title, description, targets, { unit = 'short', stack = false, bars = false, min, max, overrides = [], w = 12, h = 8 } = {}) {
  const custom = {
    drawStyle: bars ? 'bars' : 'line',
    lineWidth: 1,
    fillOpacity: stack ? 60 : 10,
    showPoints: 'never',
    spanNulls: false,
    stacking: { mode: stack ? 'normal' : 'none', group: 'A' },
    axisPlacement: 'auto',
    axisSoftMin: 0,
  };
  const defaults = { unit, custom, color: { mode: 'palette-classic' } };
  if (min !== undefined) defaults.min = min;
  if (max !== undefined) defaults.max = max;
  return {
    type: 'timeseries',
    id: nextId++,
    title,
    description,
    datasource: DS,
    gridPos: { x: 0, y: 0, w, h },
    targets,
    fieldConfig: { defaults, overrides },
    options: {
      legend: { showLegend: true, displayMode: 'table', placement: 'bottom', calcs: ['mean', 'max'] },
      tooltip: { mode: 'multi', sort: 'desc' },
    },
  };
}

function table(title, description, targets, { w = 24, h = 6 } = {}) {
  return {
    type: 'table',
    id: nextId++,
    title,
    description,
    datasource: DS,
    gridPos: { x: 0, y: 0, w, h },
    targets,
    transformations: [
      { id: 'merge', options: {} },
      { id: 'organize', options: { excludeByName: { Time: true }, renameByName: { 'Value #A': 'wait (s)', 'Value #B': 'late (s)' } } },
    ],
    fieldConfig: { defaults: { unit: 's', custom: { align: 'auto', cellOptions: { type: 'auto' }, inspect: false } }, overrides: [] },
    options: { showHeader: true, frameIndex: 0, cellHeight: 'sm' },
  };
}

const rightAxis = (refId, unit) => ({
  matcher: { id: 'byFrameRefID', options: refId },
  properties: [
    { id: 'custom.axisPlacement', value: 'right' },
    { id: 'unit', value: unit },
  ],
});
const negativeRx = {
  matcher: { id: 'byRegexp', options: '.* rx$' },
  properties: [{ id: 'custom.transform', value: 'negative-Y' }],
};

// Lay panels out left to right, two per row unless a panel is full width.
function layout(panels) {
  let x = 0;
  let y = 0;
  let rowH = 0;
  for (const p of panels) {
    const { w, h } = p.gridPos;
    if (x + w > 24) {
      x = 0;
      y += rowH;
      rowH = 0;
    }
    p.gridPos = { x, y, w, h };
    x += w;
    rowH = Math.max(rowH, h);
  }
  return panels;
}

// "Per step" divides by the steps each host attributed (every host sees the same steps of its
// ranks, so this is the mean over hosts); a host without steps in the window has no per-step
// value (not 0/0 = NaN), so it gets the 0 fallback.
const perStep = (expr, by) =>
  `${expr} / on(${by}) group_left() (sum by (${by}) (rate(stepwise_steps_total{${SEL}}[${RI}])) > 0)`;

// The straggler is the one rank that stands out among all ranks of the selected pods: not
// narrowed by local rank (one local rank per host alone has no "others" to compare with).
const waitIncrease = `sum by (instance, rank) (increase(stepwise_rank_wait_seconds_total{${SEL_POD}}[$__range]))`;

const DASHBOARDS = [
  {
    file: 'step-time.json',
    uid: 'stepwise-step-time',
    title: 'Stepwise / Step time',
    description: 'How long training steps take and where their seconds go: the seven causes always sum to the step time.',
    panels: [
      timeseries(
        'Step duration percentiles',
        'Duration of attributed steps (markers or the period of collectives).',
        ['0.5', '0.9', '0.99'].map((q, i) =>
          target(String.fromCharCode(65 + i), `histogram_quantile(${q}, sum by (le) (rate(stepwise_step_duration_seconds_bucket{${SEL}}[${RI}])))`, `p${Math.round(Number(q) * 100)}`),
        ),
        { unit: 's' },
      ),
      timeseries(
        'Slow steps',
        'Steps longer than the slow-step threshold ([steps] slow_step; default 1.5 x the median), against all steps. Each agent counts every step its ranks take part in, so a step of a job on N hosts is counted by N agents: the panel takes the largest count among the selected hosts (each step once), not their sum (each step N times). Select the hosts of one job to see that job.',
        [
          target('A', `max(increase(stepwise_slow_steps_total{${SEL}}[${RI}]))`, 'slow steps'),
          target('B', `max(increase(stepwise_steps_total{${SEL}}[${RI}]))`, 'all steps'),
        ],
        { unit: 'short', bars: true },
      ),
      timeseries(
        'Attributed seconds per step, by cause',
        'Mean seconds per step attributed to each cause (compute, ideal_comm, intra_host, readiness_skew, rail_imbalance, in_flight_limit, congestion, unexplained); stacked, they are the mean step time.',
        [target('A', perStep(`sum by (instance, cause) (rate(stepwise_step_attributed_seconds_total{${SEL}}[${RI}]))`, 'instance'), '{{instance}} {{cause}}')],
        { unit: 's', stack: true, w: 24, h: 10 },
      ),
    ],
  },
  {
    file: 'ranks-skew.json',
    uid: 'stepwise-ranks-skew',
    title: 'Stepwise / Ranks & skew',
    description: 'Which rank makes the others wait. A straggler arrives late at its collectives and so waits least itself, while every other rank waits for it.',
    panels: [
      timeseries(
        'Lateness per rank',
        'Seconds per step a rank arrived at its collectives after the first rank.',
        [target('A', perStep(`sum by (instance, rank) (rate(stepwise_rank_late_seconds_total{${SEL_RANK}}[${RI}]))`, 'instance'), 'rank {{rank}} ({{instance}})')],
        { unit: 's' },
      ),
      timeseries(
        'Wait per rank',
        'Seconds per step a rank waited inside collectives for the last rank.',
        [target('A', perStep(`sum by (instance, rank) (rate(stepwise_rank_wait_seconds_total{${SEL_RANK}}[${RI}]))`, 'instance'), 'rank {{rank}} ({{instance}})')],
        { unit: 's' },
      ),
      table(
        'Straggler across hosts',
        'A: the rank that waits least (under half the median rank) while every other rank waits (at least half the median), over the dashboard range, across every selected host. B: the rank that arrived latest overall, as a cross-check. Empty when no rank stands out.',
        [
          target(
            'A',
            `(${waitIncrease} < 0.5 * scalar(quantile(0.5, ${waitIncrease}))) and on() (count(${waitIncrease} >= 0.5 * scalar(quantile(0.5, ${waitIncrease}))) == count(${waitIncrease}) - 1)`,
            'rank {{rank}} ({{instance}})',
            { instant: true, range: false, format: 'table' },
          ),
          target('B', `topk(1, sum by (instance, rank) (increase(stepwise_rank_late_seconds_total{${SEL_POD}}[$__range])))`, 'rank {{rank}} ({{instance}})', {
            instant: true,
            range: false,
            format: 'table',
          }),
        ],
      ),
      timeseries(
        'Open collectives and suspected hangs',
        "A: seconds the oldest open call of each communicator has been open (0 when none is). B (right axis): 1 while the agent's [hang] rule suspects the communicator hung (a rank inside past max(floor, k × median) while others have not arrived or exited). `agent diagnose --hang` names the missing ranks.",
        [
          target('A', `max by (instance, comm) (stepwise_collective_open_seconds{${SEL}})`, '{{comm}} open ({{instance}})'),
          target('B', `max by (instance) (stepwise_hang_suspected{${SEL}})${ZERO_BY_HOST}`, 'suspected ({{instance}})'),
        ],
        { unit: 's', w: 24, overrides: [rightAxis('B', 'none')] },
      ),
    ],
  },
  {
    file: 'nics-rails.json',
    uid: 'stepwise-nics-rails',
    title: 'Stepwise / NICs & rails',
    description: 'Bytes per rail and per NIC, how evenly the rails share them, and how close each link is to its rate.',
    panels: [
      timeseries(
        'Bytes per rail',
        'RDMA port counters summed per rail (transmit up, receive down).',
        [
          target('A', `sum by (rail) (rate(stepwise_nic_transmit_bytes_total{${SEL}}[${RI}]))`, 'rail {{rail}} tx'),
          target('B', `sum by (rail) (rate(stepwise_nic_receive_bytes_total{${SEL}}[${RI}]))`, 'rail {{rail}} rx'),
        ],
        { unit: 'Bps', overrides: [negativeRx] },
      ),
      timeseries(
        'Bytes per NIC',
        'Per RDMA port (PMA counters: RDMA traffic only on RoCE) and per network interface (netdev statistics: everything else).',
        [
          target('A', `sum by (instance, device, port, netdev) (rate(stepwise_nic_transmit_bytes_total{${SEL}}[${RI}]))`, '{{instance}} {{device}}/{{port}} tx'),
          target('B', `sum by (instance, device, port, netdev) (rate(stepwise_nic_receive_bytes_total{${SEL}}[${RI}]))`, '{{instance}} {{device}}/{{port}} rx'),
          target('C', `sum by (instance, netdev) (rate(stepwise_netdev_transmit_bytes_total{${SEL}}[${RI}]))`, '{{instance}} {{netdev}} tx'),
          target('D', `sum by (instance, netdev) (rate(stepwise_netdev_receive_bytes_total{${SEL}}[${RI}]))`, '{{instance}} {{netdev}} rx'),
        ],
        { unit: 'Bps', overrides: [negativeRx] },
      ),
      timeseries(
        'Rail share vs balanced',
        "Share of the last step's NIC bytes carried by each rail, against the balanced share 1/rails; right axis: busiest rail over the mean rail (1 = balanced).",
        [
          target('A', `avg by (rail) (stepwise_rail_bytes_ratio{${SEL}})`, 'rail {{rail}}'),
          target('B', `1 / count(count by (rail) (stepwise_rail_bytes_ratio{${SEL}}))`, 'balanced'),
          target('C', `max(stepwise_rail_imbalance_ratio{${SEL}})`, 'busiest / mean'),
        ],
        { unit: 'percentunit', min: 0, overrides: [rightAxis('C', 'none')] },
      ),
      timeseries(
        'Link utilisation',
        'Bytes per second over the port rate (sysfs `rate`, or [steps] nic_rates).',
        [
          target(
            'A',
            `sum by (instance, device, port, netdev, rail) (rate(stepwise_nic_transmit_bytes_total{${SEL}}[${RI}])) / on(instance, device, port, netdev, rail) max by (instance, device, port, netdev, rail) (stepwise_nic_link_rate_bytes_per_second{${SEL}})`,
            '{{instance}} {{device}}/{{port}} tx',
          ),
          target(
            'B',
            `sum by (instance, device, port, netdev, rail) (rate(stepwise_nic_receive_bytes_total{${SEL}}[${RI}])) / on(instance, device, port, netdev, rail) max by (instance, device, port, netdev, rail) (stepwise_nic_link_rate_bytes_per_second{${SEL}})`,
            '{{instance}} {{device}}/{{port}} rx',
          ),
        ],
        { unit: 'percentunit', min: 0, max: 1 },
      ),
      timeseries(
        'TCP: N·m/T vs rate',
        "Little's law per interface for the TCP connections (gloo, MPI's tcp btl, NCCL's socket transport): bytes in flight over smoothed RTT (N·m/T, integrated every sweep), against the bytes the interface counter sent (the two agree within a few per cent when the connections carry the interface's traffic) and the interface's nominal rate as attribution uses it (N·m/T far below it while busy is an in-flight limit).",
        [
          target('A', `sum by (instance, netdev) (rate(stepwise_tcp_in_flight_per_rtt_bytes_total{${SEL}}[${RI}]))`, '{{instance}} {{netdev}} N·m/T'),
          target('B', `sum by (instance, netdev) (rate(stepwise_netdev_transmit_bytes_total{${SEL}}[${RI}])) and on(instance, netdev) stepwise_tcp_connections{${SEL}}`, '{{instance}} {{netdev}} counter tx'),
          target(
            'C',
            `max by (instance, netdev) (stepwise_nic_rate_bytes_per_second{${SEL}}) and on(instance, netdev) stepwise_tcp_connections{${SEL}}`,
            '{{instance}} {{netdev}} rate',
          ),
        ],
        { unit: 'Bps', min: 0 },
      ),
      timeseries(
        'TCP: in flight N and round trip T',
        'Mean bytes in flight (N·m) per interface and, right axis, the mean smoothed RTT (T) of the connections that carried data; the share of busy time the send buffer or the receive window held them is the in-flight limit of attribution.',
        [
          target('A', `sum by (instance, netdev) (rate(stepwise_tcp_in_flight_byte_seconds_total{${SEL}}[${RI}]))`, '{{instance}} {{netdev}} in flight'),
          target(
            'B',
            `sum by (instance, netdev) (rate(stepwise_tcp_rtt_seconds_sum{${SEL}}[${RI}])) / sum by (instance, netdev) (rate(stepwise_tcp_rtt_seconds_count{${SEL}}[${RI}]))`,
            '{{instance}} {{netdev}} RTT',
          ),
        ],
        { unit: 'bytes', min: 0, overrides: [rightAxis('B', 's')] },
      ),
      timeseries(
        'NCCL: requests in flight N and N·m/T',
        "Little's law for NCCL's network transport. Per communicator, from the profiler plugin's proxy steps (every request of the processes that load it): N = mean send requests in flight (SendWait time per second), and N·m/T, the bytes per second they carried (right axis). Per NIC, from the sampled ncclIb* probes: N over the sampled seconds. N near 1 while the transfer runs far below the NIC's rate is the in-flight limit of attribution.",
        [
          target('A', `sum by (instance, comm) (rate(stepwise_proxy_request_occupancy_seconds_total{${SEL}, direction="send"}[${RI}]))`, '{{instance}} comm {{comm}} N'),
          target(
            'B',
            `sum by (instance, nic) (rate(stepwise_net_request_occupancy_seconds_total{${SEL}, direction="send"}[${RI}])) / on(instance) group_left sum by (instance) (rate(stepwise_net_sampled_seconds_total{${SEL}}[${RI}]))`,
            '{{instance}} {{nic}} N (sampled)',
          ),
          target('C', `sum by (instance, comm) (rate(stepwise_proxy_request_bytes_total{${SEL}, direction="send"}[${RI}]))`, '{{instance}} comm {{comm}} N·m/T'),
        ],
        { unit: 'none', min: 0, overrides: [rightAxis('C', 'Bps')] },
      ),
    ],
  },
  {
    file: 'congestion.json',
    uid: 'stepwise-congestion',
    title: 'Stepwise / Congestion',
    description: 'Back-pressure from the fabric (PFC pauses, ECN marks and CNPs, transmit wait) and from the host (qdisc backlog and drops, retransmissions).',
    panels: [
      timeseries(
        'PFC pause time per priority',
        'Fraction of time paused, per priority and direction (mlx5 ethtool -S *_prio<p>_pause_duration; rx = pauses received, which stop this NIC sending).',
        [target('A', `sum by (instance, netdev, direction, priority) (rate(stepwise_nic_pfc_pause_seconds_total{${SEL}}[${RI}]))`, '{{instance}} {{netdev}} {{direction}} prio {{priority}}')],
        { unit: 'percentunit', min: 0 },
      ),
      timeseries(
        'PFC pause frames per priority',
        'Pause frames per second, per priority and direction (mlx5 ethtool -S *_prio<p>_pause).',
        [target('A', `sum by (instance, netdev, direction, priority) (rate(stepwise_nic_pfc_pause_frames_total{${SEL}}[${RI}]))`, '{{instance}} {{netdev}} {{direction}} prio {{priority}}')],
        { unit: 'pps' },
      ),
      timeseries(
        'ECN marks and CNPs',
        'RoCEv2 packets received with ECN CE (np_ecn_marked_roce_packets), CNPs sent back (np_cnp_sent) and CNPs that throttled this NIC (rp_cnp_handled).',
        [
          target('A', `sum by (instance, device) (rate(stepwise_nic_ecn_marked_packets_total{${SEL}}[${RI}]))`, '{{instance}} {{device}} ECN marked'),
          target('B', `sum by (instance, device) (rate(stepwise_nic_cnp_sent_total{${SEL}}[${RI}]))`, '{{instance}} {{device}} CNP sent'),
          target('C', `sum by (instance, device) (rate(stepwise_nic_cnp_handled_total{${SEL}}[${RI}]))`, '{{instance}} {{device}} CNP handled'),
        ],
        { unit: 'pps' },
      ),
      timeseries(
        'Transmit wait',
        'Share of time data was queued but the port could not send (credits, PFC): the rate of stepwise_nic_transmit_wait_seconds_total, port_xmit_wait ticks times [steps.params] xmit_wait_tick_seconds (default 4 ns).',
        [target('A', `sum by (instance, device, port) (rate(stepwise_nic_transmit_wait_seconds_total{${SEL}}[${RI}]))`, '{{instance}} {{device}}/{{port}}')],
        { unit: 'percentunit' },
      ),
      timeseries(
        'Qdisc backlog and drops',
        'Bytes queued in each qdisc (left) and packets it dropped per second (right).',
        [
          target('A', `sum by (instance, netdev, kind) (stepwise_qdisc_backlog_bytes{${SEL}})`, '{{instance}} {{netdev}} {{kind}} backlog'),
          target('B', `sum by (instance, netdev, kind) (rate(stepwise_qdisc_drops_total{${SEL}}[${RI}]))`, '{{instance}} {{netdev}} {{kind}} drops'),
        ],
        { unit: 'bytes', overrides: [rightAxis('B', 'pps')] },
      ),
      timeseries(
        'Retransmissions',
        'TCP retransmissions per interface (tcp:tcp_retransmit_skb) and RDMA retransmission events per reason (mlx5 hw_counters).',
        [
          target('A', `sum by (instance, netdev) (rate(stepwise_tcp_retransmits_total{${SEL}}[${RI}]))`, '{{instance}} {{netdev}} TCP'),
          target('B', `sum by (instance, device, reason) (rate(stepwise_nic_retransmit_events_total{${SEL}}[${RI}]))`, '{{instance}} {{device}} {{reason}}'),
        ],
        { unit: 'short' },
      ),
    ],
  },
  {
    file: 'agent-health.json',
    uid: 'stepwise-agent-health',
    title: 'Stepwise / Agent health',
    description: 'Whether every agent reads what it should: sources up, probes attached, events and drops, errors, sweep durations.',
    panels: [
      timeseries(
        'Sources up',
        "1 if the source's last sweep succeeded (rdma, ethtool, netdev, qdisc, tcp, collectives).",
        [target('A', `min by (instance, source) (stepwise_source_up{${SEL}})`, '{{instance}} {{source}}')],
        { unit: 'none', min: 0, max: 1 },
      ),
      timeseries(
        'Probes attached',
        'Probed functions currently attached, per library family.',
        [target('A', `sum by (instance, library) (stepwise_probe_attached{${SEL}})`, '{{instance}} {{library}}')],
        { unit: 'none' },
      ),
      timeseries(
        'Probe events and drops',
        'Probe events received from the kernel, and events dropped because the ring buffer was full (should stay 0).',
        [
          target('A', `sum by (instance) (rate(stepwise_probe_events_total{${SEL}}[${RI}]))`, '{{instance}} events'),
          target('B', `sum by (instance) (rate(stepwise_probe_drops_total{${SEL}}[${RI}]))`, '{{instance}} drops'),
        ],
        { unit: 'short', overrides: [rightAxis('B', 'short')] },
      ),
      timeseries(
        'Errors',
        'Errors per second by source and kind (bad values, failed reads, vanished devices, refused markers...).',
        [target('A', `sum by (instance, source, kind) (rate(stepwise_errors_total{${SEL}}[${RI}]))`, '{{instance}} {{source}} {{kind}}')],
        { unit: 'short' },
      ),
      timeseries(
        'Sweep duration (p99)',
        'Time one sweep of each counter source takes (the sampling interval must stay well above it).',
        [target('A', `histogram_quantile(0.99, sum by (instance, source, le) (rate(stepwise_source_sweep_duration_seconds_bucket{${SEL}}[${RI}])))`, '{{instance}} {{source}}')],
        { unit: 's', w: 24 },
      ),
    ],
  },
];

function dashboard(d) {
  return {
    uid: d.uid,
    title: d.title,
    description: d.description,
    tags: ['stepwise'],
    editable: true,
    graphTooltip: 1,
    fiscalYearStartMonth: 0,
    liveNow: false,
    refresh: '30s',
    schemaVersion: SCHEMA_VERSION,
    time: { from: 'now-1h', to: 'now' },
    timepicker: {},
    timezone: 'browser',
    version: 1,
    annotations: {
      list: [
        {
          builtIn: 1,
          datasource: { type: 'grafana', uid: '-- Grafana --' },
          enable: true,
          hide: true,
          iconColor: 'rgba(0, 211, 255, 1)',
          name: 'Annotations & Alerts',
          type: 'dashboard',
        },
      ],
    },
    links: [
      {
        title: 'Stepwise',
        type: 'dashboards',
        tags: ['stepwise'],
        asDropdown: true,
        includeVars: true,
        keepTime: true,
        targetBlank: false,
        icon: 'external link',
        tooltip: '',
        url: '',
      },
    ],
    templating: { list: VARIABLES },
    panels: layout(d.panels),
  };
}

const here = dirname(fileURLToPath(import.meta.url));
// Without OUT_DIR: dashboards/ and the Helm chart's copy (its Grafana sidecar ConfigMap reads
// deploy/helm/stepwise/files/dashboards/; Helm cannot read files outside the chart).
const outs = process.argv[2] ? [process.argv[2]] : [join(here, '..'), join(here, '../../deploy/helm/stepwise/files/dashboards')];
for (const out of outs) {
  mkdirSync(out, { recursive: true });
  for (const d of DASHBOARDS) {
    writeFileSync(join(out, d.file), JSON.stringify(dashboard(d), null, 2) + '\n');
  }
  console.log(`wrote ${DASHBOARDS.length} dashboards to ${out}`);
}
