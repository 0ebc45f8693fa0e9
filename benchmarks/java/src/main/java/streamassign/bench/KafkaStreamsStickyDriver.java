package streamassign.bench;

import java.io.IOException;
import java.io.PrintWriter;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Collections;
import java.util.Comparator;
import java.util.HashMap;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.Set;
import java.util.SortedSet;
import java.util.TreeMap;
import java.util.TreeSet;
import java.util.UUID;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;

import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.streams.processor.TaskId;
import org.apache.kafka.streams.processor.assignment.ApplicationState;
import org.apache.kafka.streams.processor.assignment.AssignmentConfigs;
import org.apache.kafka.streams.processor.assignment.KafkaStreamsAssignment;
import org.apache.kafka.streams.processor.assignment.KafkaStreamsAssignment.AssignedTask;
import org.apache.kafka.streams.processor.assignment.KafkaStreamsState;
import org.apache.kafka.streams.processor.assignment.ProcessId;
import org.apache.kafka.streams.processor.assignment.TaskAssignmentUtils;
import org.apache.kafka.streams.processor.assignment.TaskAssignor.TaskAssignment;
import org.apache.kafka.streams.processor.assignment.TaskInfo;
import org.apache.kafka.streams.processor.assignment.TaskTopicPartition;
import org.apache.kafka.streams.processor.assignment.assignors.StickyTaskAssignor;
import org.apache.kafka.streams.state.HostInfo;

/**
 * Times Kafka Streams' {@link StickyTaskAssignor} (the KIP-924 public API) on one input written by
 * benchmarks/_kafka_streams_peer.py, and writes its last assignment and the times back.
 *
 * <p>Usage: {@code KafkaStreamsStickyDriver INPUT OUTPUT}. Both files are plain text, one record
 * per line, fields separated by single spaces; a task is {@code SUBTOPOLOGY_PARTITION}.
 *
 * <pre>
 * input:   standbys N | repeats N | budget_s S | min_total_s S
 *          task SUBTOPOLOGY PARTITION stateful|stateless
 *          client PROCESS_ID THREADS
 *          active PROCESS_ID TASK...   standby PROCESS_ID TASK...   lag PROCESS_ID TASK=LAG...
 * output:  status ok|budget|error       message TEXT (budget, error)
 *          first_run_s S   median_s S   runs N   validation NONE|error name
 *          active PROCESS_ID TASK...    standby PROCESS_ID TASK...
 * </pre>
 *
 * <p>Timing is in-JVM: the first run (class loading, interpreted code, JIT) is reported apart as
 * {@code first_run_s}; {@code median_s} is the median of the runs after it, each started after
 * {@code System.gc()} off the clock, at least {@code repeats} of them, more until
 * {@code min_total_s} is spent (at most 100). Each run is cut at {@code budget_s} (status
 * {@code budget}: the driver stops the JVM, since a running assignor cannot be interrupted), and no
 * further run starts once the runs so far used half the budget. JVM start-up is not timed.
 */
public final class KafkaStreamsStickyDriver {

    private static final int MAX_RUNS = 100;

    private KafkaStreamsStickyDriver() {
    }

    public static void main(final String[] args) throws IOException, InterruptedException {
        if (args.length != 2) {
            System.err.println("usage: KafkaStreamsStickyDriver INPUT OUTPUT");
            System.exit(2);
        }
        final Input input = Input.read(Path.of(args[0]));
        final Path output = Path.of(args[1]);
        final ApplicationState state = input.applicationState();
        // A daemon thread runs the assignor so that a run over budget can be abandoned.
        final ExecutorService runner = Executors.newSingleThreadExecutor(task -> {
            final Thread thread = new Thread(task, "assignor");
            thread.setDaemon(true);
            return thread;
        });
        final List<Double> seconds = new ArrayList<>();
        TaskAssignment last = null;
        while (wantsAnotherRun(seconds, input)) {
            final StickyTaskAssignor assignor = new StickyTaskAssignor();
            System.gc();
            final Future<TimedRun> run = runner.submit(() -> {
                final long start = System.nanoTime();
                final TaskAssignment result = assignor.assign(state);
                return new TimedRun((System.nanoTime() - start) / 1e9, result);
            });
            try {
                final TimedRun done = run.get((long) (input.budgetSeconds * 1e9), TimeUnit.NANOSECONDS);
                seconds.add(done.seconds());
                last = done.assignment();
            } catch (final TimeoutException overBudget) {
                writeStopped(output, "budget", "over " + input.budgetSeconds + " s", seconds);
                Runtime.getRuntime().halt(0);
            } catch (final ExecutionException failed) {
                final Throwable cause = failed.getCause();
                writeStopped(output, "error", cause.getClass().getSimpleName() + ": " + cause.getMessage(), seconds);
                Runtime.getRuntime().halt(0);
            }
            if (2 * sum(seconds) > input.budgetSeconds) {
                break;
            }
        }
        writeResult(output, state, seconds, last);
        runner.shutdown();
    }

    /** The warm-up run plus {@code repeats}, then more while under {@code min_total_s}. */
    private static boolean wantsAnotherRun(final List<Double> seconds, final Input input) {
        if (seconds.size() < input.repeats + 1) {
            return true;
        }
        return sum(seconds.subList(1, seconds.size())) < input.minTotalSeconds && seconds.size() < MAX_RUNS + 1;
    }

    private static double sum(final List<Double> values) {
        double total = 0;
        for (final double value : values) {
            total += value;
        }
        return total;
    }

    /** Median of the runs after the first; the first alone when it is the only one. */
    private static double medianAfterFirst(final List<Double> seconds) {
        final List<Double> kept = new ArrayList<>(seconds.size() > 1 ? seconds.subList(1, seconds.size()) : seconds);
        Collections.sort(kept);
        final int middle = kept.size() / 2;
        return kept.size() % 2 == 1 ? kept.get(middle) : (kept.get(middle - 1) + kept.get(middle)) / 2;
    }

    private static void writeStopped(final Path output, final String status, final String message,
                                     final List<Double> seconds) throws IOException {
        try (PrintWriter out = new PrintWriter(Files.newBufferedWriter(output, StandardCharsets.UTF_8))) {
            out.println("status " + status);
            out.println("message " + message.replace('\n', ' '));
            out.println("runs " + seconds.size());
            if (!seconds.isEmpty()) {
                out.println("first_run_s " + seconds.get(0));
            }
        }
    }

    private static void writeResult(final Path output, final ApplicationState state, final List<Double> seconds,
                                    final TaskAssignment assignment) throws IOException {
        // The check Kafka Streams' StreamsPartitionAssignor runs on a custom assignor's result.
        final var validation = TaskAssignmentUtils.validateTaskAssignment(state, assignment);
        final Map<ProcessId, String> names = ((BenchApplicationState) state).names();
        try (PrintWriter out = new PrintWriter(Files.newBufferedWriter(output, StandardCharsets.UTF_8))) {
            out.println("status ok");
            out.println("first_run_s " + seconds.get(0));
            out.println("median_s " + medianAfterFirst(seconds));
            out.println("runs " + Math.max(1, seconds.size() - 1));
            out.println("validation " + validation.name());
            for (final KafkaStreamsAssignment client : assignment.assignment()) {
                final StringBuilder active = new StringBuilder("active ").append(names.get(client.processId()));
                final StringBuilder standby = new StringBuilder("standby ").append(names.get(client.processId()));
                for (final AssignedTask task : client.tasks().values()) {
                    final StringBuilder line = task.type() == AssignedTask.Type.ACTIVE ? active : standby;
                    line.append(' ').append(task.id().subtopology()).append('_').append(task.id().partition());
                }
                out.println(active);
                out.println(standby);
            }
        }
    }

    private record TimedRun(double seconds, TaskAssignment assignment) {
    }

    // -- the input, as KIP-924's ApplicationState ------------------------------------------------

    /** What the Python side wrote: the assignor's settings and the group's tasks and clients. */
    private static final class Input {
        int standbys;
        int repeats = 5;
        double budgetSeconds = 60;
        double minTotalSeconds;
        final Map<TaskId, TaskInfo> tasks = new HashMap<>();
        final Map<String, ClientInput> clients = new LinkedHashMap<>();

        static Input read(final Path path) throws IOException {
            final Input input = new Input();
            for (final String line : Files.readAllLines(path, StandardCharsets.UTF_8)) {
                final String[] fields = line.strip().split(" ");
                switch (fields[0]) {
                    case "" -> { }
                    case "standbys" -> input.standbys = Integer.parseInt(fields[1]);
                    case "repeats" -> input.repeats = Integer.parseInt(fields[1]);
                    case "budget_s" -> input.budgetSeconds = Double.parseDouble(fields[1]);
                    case "min_total_s" -> input.minTotalSeconds = Double.parseDouble(fields[1]);
                    case "task" -> input.addTask(fields);
                    case "client" -> input.clients.put(fields[1], new ClientInput(Integer.parseInt(fields[2])));
                    case "active" -> addTasks(input.client(fields[1]).previousActive, fields);
                    case "standby" -> addTasks(input.client(fields[1]).previousStandby, fields);
                    case "lag" -> input.addLags(fields);
                    default -> throw new IllegalArgumentException("unknown record: " + line);
                }
            }
            return input;
        }

        private ClientInput client(final String name) {
            final ClientInput client = clients.get(name);
            if (client == null) {
                throw new IllegalArgumentException("history for unknown client " + name);
            }
            return client;
        }

        private void addTask(final String[] fields) {
            final TaskId id = new TaskId(Integer.parseInt(fields[1]), Integer.parseInt(fields[2]));
            final boolean stateful = "stateful".equals(fields[3]);
            // As Kafka Streams describes a task: its source partition, and for a stateful task one
            // store with its changelog partition (the sticky assignor places standbys only for tasks
            // with a changelog).
            final Set<TaskTopicPartition> partitions = new HashSet<>();
            partitions.add(new BenchTopicPartition(new TopicPartition("source-" + id.subtopology(), id.partition()),
                true, false, Optional.empty()));
            final Set<String> stores = stateful ? Set.of("store-" + id.subtopology()) : Set.of();
            if (stateful) {
                partitions.add(new BenchTopicPartition(
                    new TopicPartition("app-store-" + id.subtopology() + "-changelog", id.partition()),
                    false, true, Optional.empty()));
            }
            tasks.put(id, new BenchTaskInfo(id, stateful, stores, partitions));
        }

        private void addLags(final String[] fields) {
            final ClientInput client = client(fields[1]);
            for (int i = 2; i < fields.length; i++) {
                final String[] taskAndLag = fields[i].split("=");
                client.lags.put(parseTask(taskAndLag[0]), Long.parseLong(taskAndLag[1]));
            }
        }

        private static void addTasks(final SortedSet<TaskId> into, final String[] fields) {
            for (int i = 2; i < fields.length; i++) {
                into.add(parseTask(fields[i]));
            }
        }

        private static TaskId parseTask(final String text) {
            final int split = text.indexOf('_');
            return new TaskId(Integer.parseInt(text.substring(0, split)), Integer.parseInt(text.substring(split + 1)));
        }

        /** Process ids are UUIDs in Kafka Streams: client number i (input order) gets UUID(0, i). */
        BenchApplicationState applicationState() {
            final Map<ProcessId, KafkaStreamsState> states = new HashMap<>();
            final Map<ProcessId, String> names = new HashMap<>();
            int index = 0;
            for (final Map.Entry<String, ClientInput> entry : clients.entrySet()) {
                final ProcessId id = new ProcessId(new UUID(0L, index++));
                names.put(id, entry.getKey());
                states.put(id, entry.getValue().state(id));
            }
            // Kafka Streams' defaults (acceptable.recovery.lag 10000, max.warmup.replicas 2,
            // probing.rebalance.interval.ms 10 min, no rack-aware tags or strategy).
            final AssignmentConfigs configs = new AssignmentConfigs(10_000L, 2, standbys, 600_000L, List.of());
            return new BenchApplicationState(Collections.unmodifiableMap(states), configs,
                Collections.unmodifiableMap(tasks), names);
        }
    }

    /** One client as read, before it has a process id. */
    private static final class ClientInput {
        final int threads;
        final SortedSet<TaskId> previousActive = new TreeSet<>();
        final SortedSet<TaskId> previousStandby = new TreeSet<>();
        final Map<TaskId, Long> lags = new TreeMap<>();

        ClientInput(final int threads) {
            this.threads = threads;
        }

        BenchKafkaStreamsState state(final ProcessId id) {
            // One consumer per stream thread, named as Kafka Streams names them.
            final SortedSet<String> consumers = new TreeSet<>();
            for (int thread = 1; thread <= threads; thread++) {
                consumers.add(id + "-StreamThread-" + thread + "-consumer");
            }
            return new BenchKafkaStreamsState(id, threads, Collections.unmodifiableSortedSet(consumers),
                Collections.unmodifiableSortedSet(previousActive), Collections.unmodifiableSortedSet(previousStandby),
                Collections.unmodifiableMap(lags));
        }
    }

    private record BenchApplicationState(Map<ProcessId, KafkaStreamsState> states, AssignmentConfigs assignmentConfigs,
                                         Map<TaskId, TaskInfo> allTasks, Map<ProcessId, String> names)
        implements ApplicationState {

        @Override
        public Map<ProcessId, KafkaStreamsState> kafkaStreamsStates(final boolean computeTaskLags) {
            return states;
        }
    }

    private record BenchTaskInfo(TaskId id, boolean isStateful, Set<String> stateStoreNames,
                                 Set<TaskTopicPartition> topicPartitions) implements TaskInfo {
    }

    private record BenchTopicPartition(TopicPartition topicPartition, boolean isSource, boolean isChangelog,
                                       Optional<Set<String>> rackIds) implements TaskTopicPartition {
    }

    private record BenchKafkaStreamsState(ProcessId processId, int numProcessingThreads,
                                          SortedSet<String> consumerClientIds, SortedSet<TaskId> previousActiveTasks,
                                          SortedSet<TaskId> previousStandbyTasks, Map<TaskId, Long> lags)
        implements KafkaStreamsState {

        @Override
        public long lagFor(final TaskId task) {
            final Long lag = lags.get(task);
            if (lag == null) {
                throw new IllegalStateException("no lag reported for " + task + " by " + processId);
            }
            return lag;
        }

        /** Previous tasks by lag; with one consumer per thread the split is not known here, so all. */
        @Override
        public SortedSet<TaskId> prevTasksByLag(final String consumerClientId) {
            final SortedSet<TaskId> byLag = new TreeSet<>(
                Comparator.comparingLong(this::lagFor).thenComparing(TaskId::compareTo));
            byLag.addAll(lags.keySet());
            return byLag;
        }

        @Override
        public Map<TaskId, Long> statefulTasksToLagSums() {
            return lags;
        }

        @Override
        public Optional<HostInfo> hostInfo() {
            return Optional.empty();
        }

        @Override
        public Map<String, String> clientTags() {
            return Map.of();
        }

        @Override
        public Optional<String> rackId() {
            return Optional.empty();
        }
    }
}
