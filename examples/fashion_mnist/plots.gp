# Plots of an experiment directory. Called as: gnuplot -e "dir='DIR'; target=0.8" plots.gp
if (!exists("dir")) dir = "."
if (!exists("target")) target = 0.8
set datafile separator ","
set terminal pngcairo size 1100,700 noenhanced font ",10"

# Accuracy against modelled cluster time, one line per scheme (schemes are contiguous blocks of curves.csv).
set output dir."/accuracy_vs_time.png"
set title "Test accuracy vs modelled cluster time"
set xlabel "modelled time (s): measured compute + modelled communication"
set ylabel "test accuracy"
set key outside right top
set grid
set logscale x
schemes = system("tail -n +2 '".dir."/curves.csv' | cut -d, -f1 | uniq | tr '\\n' ' '")
set arrow from graph 0, first target to graph 1, first target nohead dt 2 lc rgb "gray"
plot for [s in schemes] dir."/curves.csv" using (strcol(1) eq s ? $6 : NaN):11 with linespoints pt 7 ps 0.6 title s

# Bytes each node sends and receives over the whole run.
unset logscale x
unset arrow
set output dir."/bytes_per_scheme.png"
set title "Traffic per node over the run (largest over ranks)"
set xlabel ""
set ylabel "MB per node"
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.8 border -1
set boxwidth 0.9
set xtics rotate by -40 left
set logscale y
set key inside top right
# every ::1 skips the CSV header row, which would otherwise become an empty first bar.
plot dir."/summary.csv" every ::1 using ($8/1e6):xtic(1) title "sent", '' every ::1 using ($9/1e6) title "received"
